"""`python -m <package> sweep`: hyperparameter search with Optuna (search.py), its trial callback (report.py), its
results (results.py) and a study shared by several machines (shared_study.py). Needs the `sweep` extra."""

from .report import ReportToTrial, pruner  # the trial callback's class path, as earlier studies name it

__all__ = ["ReportToTrial", "pruner"]
