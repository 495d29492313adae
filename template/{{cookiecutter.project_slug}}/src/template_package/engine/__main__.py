"""`python -m <package>.engine fit|...`: the same command line as `python -m <package>`, wherever the engine is
copied (sweep trials start this way)."""

from .cli.main import main

if __name__ == "__main__":
    main()
