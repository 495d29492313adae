"""The engine: everything a run needs beyond your model and data, for any LightningModule and LightningDataModule.
It imports nothing from the rest of the package, so it can be copied whole into another project (requirements.txt
lists what it needs).

Its rooms, one concern each: cli/ (the command line, the run directory, checks, help, export), training/ (the Trainer,
the recipe, schedules, the monitored metric, the batch layout), resume/ (last.ckpt, random generators, durable
writes, signals, the run lock, what may change on a resume), data/ (train loaders that resume exactly, per-sample
seeds, folds), report/ (callbacks and loggers), sweep/ (hyperparameter search), and guarantees.py (the guarantee kit).

Your model and data import what they need from here, never from a room: `from ..engine import TrainingRecipe`.
"""

from .data.folds import check_fold, fold_indices
from .data.sampling import sample_seed
from .errors import UsageError
from .resume.exact_resume import ExactResume
from .training.recipe import TrainingRecipe
from .training.schedulers import WarmupCosineSchedule
from .training.trainer import Trainer

__all__ = [
    "ExactResume",
    "Trainer",
    "TrainingRecipe",
    "UsageError",
    "WarmupCosineSchedule",
    "check_fold",
    "fold_indices",
    "sample_seed",
]
