"""`python -m template_package fit|validate|test|predict`: see cli.py."""

from .cli import main

if __name__ == "__main__":
    main()
