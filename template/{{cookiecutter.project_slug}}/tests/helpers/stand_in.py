"""The task the engine's own tests train: a stand-in for the user's model and data, so that those tests hold whatever
configs/default.yaml names (the example, or a model of the user's) and whether the example is still there.

Shaped like the digits example on purpose (1x8x8 images of 10 classes, 1,257 / 270 / 270 samples, batches of 64: 19
training batches an epoch), so that the tests' step counts read the same; but synthetic, generated in milliseconds,
and written only against the engine: a TrainingRecipe subclass with BatchNorm (buffers) and dropout (random draws),
and a DataModule with plain DataLoaders, optionally with random noise drawn per sample in `__getitem__`.
"""

import numpy as np
import torch
import torch.nn.functional as F
from lightning import LightningDataModule, LightningModule
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchmetrics.classification import MulticlassAccuracy

from template_package.engine.training.recipe import TrainingRecipe

SPLITS = {"train": 1257, "val": 270, "test": 270}


def stand_in_net(num_classes: int, in_channels: int, dropout: float, batch_norm: bool = True) -> nn.Module:
    """Two conv-BN-ReLU blocks (conv-ReLU without `batch_norm`), dropout and a linear head on the flattened
    features."""

    def norm(channels: int) -> nn.Module:
        return nn.BatchNorm2d(channels) if batch_norm else nn.Identity()

    return nn.Sequential(
        nn.Conv2d(in_channels, 16, 3, padding=1, bias=not batch_norm), norm(16), nn.ReLU(),
        nn.Conv2d(16, 8, 3, padding=1, bias=not batch_norm), norm(8), nn.ReLU(),
        nn.Flatten(), nn.Dropout(dropout), nn.Linear(8 * 8 * 8, num_classes),
    )  # fmt: skip


class StandInClassifier(TrainingRecipe):
    """The stand-in's network on the engine's training recipe.

    Args:
        num_classes: classes to tell apart; None: the data's.
        in_channels: image channels; None: the data's.
        dropout: dropout before the linear head.
        batch_norm: BatchNorm after each convolution.
    """

    def __init__(self, num_classes: int | None = None, in_channels: int | None = None, dropout: float = 0.0,
                 batch_norm: bool = True, **recipe) -> None:  # fmt: skip
        super().__init__(**recipe)
        self.save_hyperparameters()
        self.net = stand_in_net(num_classes, in_channels, dropout, batch_norm)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.example_input_array = torch.zeros(2, in_channels, 8, 8)

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        images, targets = batch
        return F.cross_entropy(self(images), targets)

    def validation_step(self, batch, batch_idx: int) -> Tensor:
        images, targets = batch
        logits = self(images)
        self.val_acc.update(logits, targets)
        self.log("val/loss", F.cross_entropy(logits, targets), sync_dist=True)
        self.log("val/acc", self.val_acc)
        return logits

    def test_step(self, batch, batch_idx: int) -> None:
        images, targets = batch
        logits = self(images)
        self.test_acc.update(logits, targets)
        self.log("test/loss", F.cross_entropy(logits, targets), sync_dist=True)
        self.log("test/acc", self.test_acc)

    def predict_step(self, batch, batch_idx: int) -> Tensor:
        return self(batch[0]).softmax(-1)


def synthetic_images(seed: int = 0) -> dict[str, TensorDataset]:
    """10 noisy prototypes of 8x8 images, split as digits is."""
    generator = torch.Generator().manual_seed(seed)
    total = sum(SPLITS.values())
    prototypes = torch.rand(10, 1, 8, 8, generator=generator)
    targets = torch.randperm(total, generator=generator) % 10
    images = prototypes[targets] + 0.5 * torch.randn(total, 1, 8, 8, generator=generator)
    parts, start = {}, 0
    for split, size in SPLITS.items():
        parts[split] = TensorDataset(images[start : start + size], targets[start : start + size])
        start += size
    return parts


class Noisy(Dataset):
    """A TensorDataset's (image, target) pairs with noise added to each image, drawn from torch's generator."""

    def __init__(self, dataset: TensorDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, target = self.dataset[index]
        return image + 0.1 * torch.randn(image.shape), target


class StandInData(LightningDataModule):
    """The synthetic splits in plain DataLoaders.

    Args:
        batch_size: samples per batch.
        num_workers: loader processes.
        augment: add random noise to each training image, drawn in `__getitem__`.
        stateful: torchdata's StatefulDataLoader instead of torch's DataLoader.
    """

    loading_options = ("num_workers",)

    def __init__(
        self, batch_size: int = 64, num_workers: int = 0, augment: bool = False, stateful: bool = False
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.num_classes, self.in_channels, self.classes = 10, 1, [str(i) for i in range(10)]
        self.splits: dict[str, Dataset] = {}

    def setup(self, stage: str) -> None:
        if not self.splits:
            self.splits = synthetic_images()
            if self.hparams.get("augment"):  # (a subclass built by the CLI may not take it)
                self.splits["train"] = Noisy(self.splits["train"])

    def _loader(self, split: str, train: bool = False) -> DataLoader:
        workers = self.hparams.num_workers
        loader_class = StatefulDataLoader if self.hparams.get("stateful") else DataLoader
        return loader_class(self.splits[split], batch_size=self.hparams.batch_size, shuffle=train, drop_last=train,
                            num_workers=workers, persistent_workers=workers > 0)  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test")


class OwnDefaultsClassifier(StandInClassifier):
    """Shares `dropout` with the stand-in, with a default of its own."""

    def __init__(
        self, num_classes: int | None = None, in_channels: int | None = None, dropout: float = 0.3, **recipe
    ) -> None:
        super().__init__(num_classes, in_channels, dropout, **recipe)


class OwnDefaultsData(StandInData):
    """Shares `batch_size` with the stand-in's data, with a default of its own."""

    def __init__(
        self, batch_size: int = 16, num_workers: int = 0, augment: bool = False, stateful: bool = False
    ) -> None:
        super().__init__(batch_size, num_workers, augment, stateful)


class FailingClassifier(StandInClassifier):
    """The stand-in with a user's error: `error` ("ValueError" or "UsageError") raised with a message of its own at
    `when` ("init" or "training_step")."""

    def __init__(self, error: str = "ValueError", when: str = "training_step", **kwargs) -> None:
        self.error, self.when = error, when
        self._raise_if("init")
        super().__init__(**kwargs)

    def _raise_if(self, when: str) -> None:
        from template_package.engine.errors import UsageError

        if when == self.when:
            raise {"ValueError": ValueError, "UsageError": UsageError}[self.error](f"{self.error} raised at {when}")

    def training_step(self, batch, batch_idx: int) -> Tensor:
        self._raise_if("training_step")
        return super().training_step(batch, batch_idx)


class UnresumableStandInData(StandInData):
    """The stand-in's data read as a stream the engine cannot make exact: an iterable dataset without state."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Stream(self.splits["train"]), batch_size=self.hparams.batch_size)


class Stream(IterableDataset):
    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __iter__(self):
        return (self.dataset[i] for i in torch.randperm(len(self.dataset)).tolist())


class DrawingStandInData(StandInData):
    """The stand-in's data with noise from a generator the engine cannot seed: `draw` "unseeded" (a new
    np.random.default_rng() for each sample) or "held" (one np.random.default_rng(0) the dataset keeps)."""

    def __init__(self, draw: str = "unseeded", **kwargs) -> None:
        super().__init__(**kwargs)
        self.draw = draw

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if not isinstance(self.splits["train"], NumpyNoisy):
            self.splits["train"] = NumpyNoisy(self.splits["train"], held=self.draw == "held")


class NumpyNoisy(Dataset):
    def __init__(self, dataset: TensorDataset, held: bool) -> None:
        self.dataset, self.rng = dataset, np.random.default_rng(0) if held else None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, target = self.dataset[index]
        rng = self.rng if self.rng is not None else np.random.default_rng()
        return image + torch.from_numpy(rng.normal(0, 0.1, image.shape)).float(), target


class PlainClassifier(LightningModule):
    """The stand-in's network in a plain LightningModule with an optimizer and schedule of its own (none of the
    recipe): SGD with momentum and `schedule` "exponential" (x0.9 a step) or "warmup_cosine" (the engine's
    WarmupCosineSchedule), stepped per `interval`."""

    def __init__(
        self, num_classes: int | None = None, in_channels: int | None = None, lr: float = 0.05,
        schedule: str = "exponential", interval: str = "step",
    ) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()
        self.net = stand_in_net(num_classes, in_channels, dropout=0.0)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        images, targets = batch
        return F.cross_entropy(self.net(images), targets)

    def validation_step(self, batch, batch_idx: int) -> None:
        images, targets = batch
        self.log("val/acc", (self.net(images).argmax(-1) == targets).float().mean())

    def configure_optimizers(self):
        from template_package.engine.training.schedulers import WarmupCosineSchedule

        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        if self.hparams.schedule == "exponential":
            schedule = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
        else:
            schedule = WarmupCosineSchedule(optimizer, warmup=2)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": self.hparams.interval}}


class LateClassesData(StandInData):
    """The stand-in's data with its number of classes known only in setup(), as a tokenizer trained on the data
    knows its vocabulary size."""

    def __init__(
        self, batch_size: int = 64, num_workers: int = 0, augment: bool = False, stateful: bool = False
    ) -> None:
        super().__init__(batch_size, num_workers, augment, stateful)
        self.num_classes = None

    def setup(self, stage: str) -> None:
        super().setup(stage)
        self.num_classes = 10


class LateHeadClassifier(StandInClassifier):
    """The stand-in that builds its layers in configure_model, after the data's setup()."""

    def __init__(self, num_classes: int | None = None, in_channels: int | None = None, **recipe) -> None:
        super().__init__(10, in_channels, **recipe)  # (its metrics are made for 10 classes)
        self.net = None

    def configure_model(self) -> None:
        if self.net is None:
            self.net = stand_in_net(self.trainer.datamodule.num_classes, 1, dropout=0.0)


class UndeclaredClassesData(StandInData):
    """The stand-in's data that names its number of classes only in setup(), never in __init__."""

    def __init__(
        self, batch_size: int = 64, num_workers: int = 0, augment: bool = False, stateful: bool = False
    ) -> None:
        super().__init__(batch_size, num_workers, augment, stateful)
        del self.num_classes

    def setup(self, stage: str) -> None:
        super().setup(stage)
        self.num_classes = 10
