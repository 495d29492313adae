"""`python -m template_package fit|validate|test|predict|sweep|export|grad_norms`: the engine's command line (see
engine/cli/main.py), with the model and data that configs/default.yaml names."""

from .engine.cli.main import main

if __name__ == "__main__":
    main()
