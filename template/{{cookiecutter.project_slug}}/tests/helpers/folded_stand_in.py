"""The stand-in's data with K-fold cross-validation (engine/data/folds.py): what a DataModule of the user's adds for
`sweep --sweep.folds K`, two arguments and a split; its train and val samples pooled and cut into folds."""

import torch
from torch.utils.data import TensorDataset

from template_package.engine.data.folds import check_fold, fold_indices

from helpers.stand_in import StandInData


class FoldedStandInData(StandInData):
    """StandInData whose run validates on fold `fold` of `folds` (1: its own train/val split)."""

    def __init__(self, folds: int = 1, fold: int = 0, **kwargs) -> None:
        check_fold(folds, fold)
        super().__init__(**kwargs)
        self.folds, self.fold = folds, fold

    def setup(self, stage: str) -> None:
        if self.splits:
            return
        super().setup(stage)
        if self.folds > 1:
            pairs = zip(self.splits["train"].tensors, self.splits["val"].tensors, strict=True)
            images, targets = (torch.cat(pair) for pair in pairs)
            train_idx, val_idx = fold_indices(len(targets), self.folds, self.fold, seed=0)
            self.splits["train"] = TensorDataset(images[train_idx], targets[train_idx])
            self.splits["val"] = TensorDataset(images[val_idx], targets[val_idx])
