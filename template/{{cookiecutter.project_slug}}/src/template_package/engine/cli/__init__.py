"""The command line: `python -m <package> fit|validate|test|predict|...` (main.py, LightningCLI in subclass mode),
the run directory, up-front checks that cost a mistake one line, `--help`, and the commands export and grad_norms."""
