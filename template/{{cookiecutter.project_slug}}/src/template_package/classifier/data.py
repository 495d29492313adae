"""The example's LightningDataModule: scikit-learn's digits by default, or your own images in ImageFolder layout
(images.py).

Digits (1,797 8x8 grayscale images, 10 classes) ship inside scikit-learn, so the default run needs no network.
For your own data, set `data_dir` to a folder with `train/<class>/*.jpg`, `val/<class>/*.jpg` and optionally
`test/<class>/*.jpg`. The loaders are plain DataLoaders: the engine rebuilds the train loader so that it resumes
exactly (engine/data/loaders.py), the random crops and flips included, whatever the number of workers.

With `on_device`, in-memory splits are held on the training device and batches are gathered there: the GPU fast
path (configs/fast.yaml), with no loader work and no host-to-device copy of images per batch.
"""

import os
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler, Subset, TensorDataset

from ..engine import UsageError, check_fold, fold_indices
from .images import ImageFiles, digits_like_transform, image_folder_transforms, load_rgb_image


def check_finite(images: torch.Tensor, name: str) -> None:
    """In-memory data is checked once, up front: a NaN in the inputs would otherwise surface as a NaN loss later."""
    bad = (~torch.isfinite(images)).flatten(1).any(1).nonzero().flatten()
    if len(bad):
        raise UsageError(f"{name} has non-finite values (NaN or inf) in {len(bad)} samples, first at index {bad[0]}")


def digits_splits(val_fraction: float, test_fraction: float, seed: int) -> tuple[Dataset, Dataset, Dataset]:
    """Digits as (train, val, test) TensorDatasets of 1x8x8 images in [0, 1], split the same way for every seed."""
    from sklearn.datasets import load_digits  # imported here: it costs a second and ImageFolder runs never need it

    digits = load_digits()
    images = torch.from_numpy(digits.images).float().div_(16.0).unsqueeze(1)
    targets = torch.from_numpy(digits.target).long()
    check_finite(images, "digits")
    order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(seed))
    n_val, n_test = round(val_fraction * len(order)), round(test_fraction * len(order))
    parts = order[n_val + n_test :], order[:n_val], order[n_val : n_val + n_test]
    return tuple(TensorDataset(images[idx], targets[idx]) for idx in parts)


class DeviceTensors(TensorDataset):
    """A TensorDataset's tensors moved to `device`, indexed a batch at a time (keys are lists of indices, which the
    engine's train loader gives any TensorDataset).

    The indices go to the device from pinned memory without blocking: a plain copy from pageable memory would make
    the host wait for the GPU to finish the previous step before queueing the next one."""

    def __init__(self, dataset: TensorDataset, device: torch.device) -> None:
        super().__init__(*(tensor.to(device) for tensor in dataset.tensors))
        self.device = device

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.tensor(indices)
        if self.device.type == "cuda":
            index = index.pin_memory().to(self.device, non_blocking=True)
        return tuple(tensor[index] for tensor in self.tensors)


def default_num_workers() -> int:
    """Half the CPUs (the main process needs the rest), at most 8; 0 on a single core."""
    return min(8, (os.cpu_count() or 1) // 2)


class ImageDataModule(L.LightningDataModule):
    """Train/val/test/predict loaders for digits (`data_dir=None`) or an ImageFolder tree, and for a folder of new
    images to predict.

    Args:
        data_dir: None for digits, else a folder holding `train/`, `val/` and optionally `test/` class folders.
        batch_size: samples per batch on each device.
        num_workers: loader processes, 0 loads in the main process. None picks 0 for digits, which sit in memory
            as one tensor (a worker would only add IPC), and `default_num_workers()` for image files to decode.
        image_size: side of the square crop fed to the network (ImageFolder only; digits are 8x8).
        val_fraction: share of digits held out for validation.
        test_fraction: share of digits held out for testing.
        split_seed: seed of the digits split, independent of the training seed so every run sees the same split.
        predict_dir: a folder of unlabeled images (nested folders too) for `predict`, instead of the test split.
        classes: the class names; found in `data_dir/train` when not given. Saved in every checkpoint with the other
            settings, so that `predict --ckpt_path X --data.predict_dir DIR` needs neither the training folder nor
            these options again.
        on_device: hold the in-memory splits (digits, or any TensorDataset) on the training device and gather each
            training, validation and test batch there (`DeviceTensors`). Same batches, same order, same resume as
            without it; on a GPU it needs the data to fit in its memory, and num_workers 0.
        folds: K > 1 for K-fold cross-validation (engine/data/folds.py): the training data (digits: train and val
            together, test held out; ImageFolder: train/) is cut into K folds by `split_seed`, and the run
            validates on fold `fold` and trains on the others. 1: the train/val split above.
        fold: which fold the run validates on, 0..folds-1.
    """

    # How the data is loaded, not which: may change when a run resumes, never taken from a checkpoint by predict.
    loading_options = ("num_workers", "on_device", "predict_dir")

    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: int = 64,
        num_workers: int | None = None,
        image_size: int = 224,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        predict_dir: str | None = None,
        classes: list[str] | None = None,
        on_device: bool = False,
        folds: int = 1,
        fold: int = 0,
    ) -> None:
        super().__init__()
        check_fold(folds, fold)
        if classes is None:
            classes = [str(i) for i in range(10)] if data_dir is None else self._find_classes(Path(data_dir))
        self.save_hyperparameters()
        self.hparams.classes = self.classes = list(classes)  # saved in checkpoints with the found ones
        if num_workers is None:
            num_workers = 0 if data_dir is None or on_device else default_num_workers()
        if on_device and num_workers:
            raise UsageError(
                f"data.num_workers={num_workers} with data.on_device: loader processes cannot index data held on the "
                "GPU; set data.num_workers 0 (batches are gathered on the device, no worker is needed)"
            )
        self.num_workers = num_workers
        self.datasets: dict[str, Dataset] = {}

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_size(self) -> int:
        """The side of the square images the network sees (8 for digits); the model takes it from here."""
        return 8 if self.hparams.data_dir is None else self.hparams.image_size

    @property
    def in_channels(self) -> int:
        return 1 if self.hparams.data_dir is None else 3

    @staticmethod
    def _find_classes(root: Path) -> list[str]:
        train = root / "train"
        if not train.is_dir():
            raise UsageError(f"data_dir={str(root)!r} has no train/ folder: expected train/<class>/ images")
        classes = sorted(entry.name for entry in train.iterdir() if entry.is_dir())
        if len(classes) < 2:
            found = f"only the class folder {classes[0]!r}" if classes else "no class folders"
            raise UsageError(f"{train} has {found}: a classifier needs train/<class>/ folders for 2 classes or more")
        return classes

    def setup(self, stage: str) -> None:
        if self.datasets:
            return
        hp = self.hparams
        if stage == "predict" and hp.predict_dir is not None:
            transform = digits_like_transform() if hp.data_dir is None else image_folder_transforms(hp.image_size)[1]
            self.datasets = {"predict": ImageFiles(hp.predict_dir, transform)}
            return
        if hp.data_dir is None:
            train, val, test = digits_splits(hp.val_fraction, hp.test_fraction, hp.split_seed)
            if hp.folds > 1:  # the folds cut what a model may learn from; test stays held out
                images, targets = (torch.cat(pair) for pair in zip(train.tensors, val.tensors, strict=True))
                train_idx, val_idx = fold_indices(len(targets), hp.folds, hp.fold, hp.split_seed)
                train = TensorDataset(images[train_idx], targets[train_idx])
                val = TensorDataset(images[val_idx], targets[val_idx])
            self.datasets = {"train": train, "val": val, "test": test, "predict": test}
            return
        from torchvision.datasets import ImageFolder

        train_tf, eval_tf = image_folder_transforms(hp.image_size)
        root = Path(hp.data_dir)
        if not (root / "val").is_dir():
            raise UsageError(f"data_dir={str(root)!r} has no val/ folder: expected val/<class>/ images")
        folders = {"val": root / "val", "test": root / "test" if (root / "test").is_dir() else root / "val"}
        self.datasets = {
            split: ImageFolder(folder, eval_tf, loader=load_rgb_image) for split, folder in folders.items()
        }
        # Random crops and flips, drawn from torch's generator: the engine seeds it for each sample from
        # (seed, epoch, index), so a resumed run, or one with other num_workers, draws the same ones.
        self.datasets["train"] = ImageFolder(root / "train", train_tf, loader=load_rgb_image)
        if hp.folds > 1:  # train/ cut into folds: the validation fold without random crops and flips
            train_idx, val_idx = fold_indices(len(self.datasets["train"]), hp.folds, hp.fold, hp.split_seed)
            self.datasets["val"] = Subset(ImageFolder(root / "train", eval_tf, loader=load_rgb_image), val_idx.tolist())
            self.datasets["train"] = Subset(self.datasets["train"], train_idx.tolist())
        self.datasets["predict"] = self.datasets["test"]

    def _device_tensors(self, split: str) -> DeviceTensors:
        """The split moved to the training device, once."""
        dataset = self.datasets[split]
        if not isinstance(dataset, TensorDataset):
            raise UsageError(
                f"data.on_device holds in-memory data (digits, a TensorDataset) on the device; the {split} split is a "
                f"{type(dataset).__name__} read from files: leave data.on_device off"
            )
        if not isinstance(dataset, DeviceTensors):
            device = self.trainer.strategy.root_device if self.trainer else torch.device("cpu")
            self.datasets[split] = dataset = DeviceTensors(dataset, device)
        return dataset

    def _loader(self, split: str) -> DataLoader:
        train = split == "train"
        on_device = self.hparams.on_device and split != "predict"  # (predictions are written on the host anyway)
        dataset = self._device_tensors(split) if on_device else self.datasets[split]
        batch_size, sampler = self.hparams.batch_size, None
        if on_device and not train:  # gathered a batch at a time (the engine does it for the train loader)
            sampler, batch_size = BatchSampler(SequentialSampler(dataset), batch_size, drop_last=False), None
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            shuffle=train,  # evaluation order stays fixed, so predictions line up with the files
            drop_last=train,  # a tiny last batch would make BatchNorm statistics and the loss noisy
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available() and not on_device,  # pinning only helps host-to-GPU copies
            persistent_workers=self.num_workers > 0,  # no process start-up cost at every epoch
            # Worker seeds are drawn from this generator, not from the global one the model's dropout uses.
            generator=torch.Generator().manual_seed(torch.initial_seed()),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("predict")
