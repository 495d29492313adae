"""K-fold cross-validation: which samples of the training data a run trains on and which it validates on.

A DataModule opts in with two `__init__` arguments, `folds: int = 1` and `fold: int = 0` (so `fit --data.folds 5
--data.fold 2`, and `sweep --sweep.folds 5`, which trains each trial once per fold), and splits its training data
with `fold_indices`; `folds=1` keeps the split it had. The example's ImageDataModule (classifier/data.py) does:

    if self.hparams.folds > 1:
        train_idx, val_idx = fold_indices(len(pool), self.hparams.folds, self.hparams.fold, self.hparams.split_seed)

The folds are the same in every run and on every machine: a permutation of the samples drawn from `seed` alone (not
from the training seed), cut into `folds` parts whose sizes differ by one at most. Plain PyTorch, no Lightning.
"""

import torch

from ..errors import UsageError


def check_fold(folds: int, fold: int) -> None:
    """One line for folds or a fold that cannot be: in the DataModule's `__init__`, before anything is loaded."""
    if not isinstance(folds, int) or isinstance(folds, bool) or folds < 1:
        raise UsageError(f"data.folds={folds!r} must be a whole number >= 1 (1: no cross-validation)")
    if not isinstance(fold, int) or isinstance(fold, bool) or not 0 <= fold < folds:
        raise UsageError(f"data.fold={fold!r} must be one of 0..{folds - 1} (data.folds={folds})")


def fold_indices(n: int, folds: int, fold: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) indices into `n` samples for fold `fold` of `folds`: part `fold` of a seeded permutation is the
    validation set, the other parts the training set. Over the folds, every sample is validated on exactly once."""
    check_fold(folds, fold)
    if n < folds:
        raise UsageError(f"data.folds={folds} is more than the {n} training samples: give data.folds <= {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    parts = torch.tensor_split(order, folds)
    return torch.cat([part for i, part in enumerate(parts) if i != fold]), parts[fold]
