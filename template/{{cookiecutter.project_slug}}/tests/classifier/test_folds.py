"""The example's data cut into folds (`--data.folds K --data.fold i`, engine/data/folds.py): digits' train and val
pooled and cut into K folds, test held out; folds=1 is the split it always had."""

from pathlib import Path

import pytest
import torch
from PIL import Image

from template_package.classifier.data import ImageDataModule
from template_package.engine.errors import UsageError


def as_multiset(*datasets) -> torch.Tensor:
    """The images of the datasets, each projected onto one random direction, sorted: equal for the same images."""
    images = torch.cat([dataset.tensors[0] for dataset in datasets]).flatten(1).double()
    return (images @ torch.rand(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))).sort().values


def setup(**options) -> ImageDataModule:
    data = ImageDataModule(**options)
    data.setup("fit")
    return data


def test_digits_folds_validate_each_train_or_val_digit_once_and_leave_test_alone():
    plain, folds = setup(), [setup(folds=3, fold=fold) for fold in range(3)]
    for data in folds:
        torch.testing.assert_close(data.datasets["test"].tensors[0], plain.datasets["test"].tensors[0])
        assert len(data.datasets["train"]) + len(data.datasets["val"]) == 1257 + 270
    validated = as_multiset(*(data.datasets["val"] for data in folds))
    torch.testing.assert_close(validated, as_multiset(plain.datasets["train"], plain.datasets["val"]))
    torch.testing.assert_close(setup(folds=1, fold=0).datasets["val"].tensors[0], plain.datasets["val"].tensors[0])


def test_image_folder_folds_cut_train_and_validate_without_augmentation(tmp_path):
    for split, count in (("train", 3), ("val", 1)):
        for label, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
            (tmp_path / split / label).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (40, 30), color).save(tmp_path / split / label / f"{i}.png")
    folds = [setup(data_dir=str(tmp_path), num_workers=0, image_size=16, folds=2, fold=fold) for fold in range(2)]
    validated = sorted(i for data in folds for i in data.datasets["val"].indices)
    assert validated == list(range(6)) and [len(data.datasets["train"]) for data in folds] == [3, 3]
    val, train = folds[0].datasets["val"].dataset, folds[0].datasets["train"].dataset
    assert Path(val.root) == tmp_path / "train" and val.transform is not train.transform  # no random crops and flips


def test_a_fold_that_cannot_be_costs_one_line():
    with pytest.raises(UsageError, match=r"^data.fold=3 must be one of 0..2 \(data.folds=3\)$"):
        ImageDataModule(folds=3, fold=3)
