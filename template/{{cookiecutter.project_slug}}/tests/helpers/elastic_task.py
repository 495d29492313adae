"""The stand-in task with each training sample's index in its batch, and a callback that records, for every
optimizer step, which samples every process read for it and the global batch's loss (tests/test_elastic.py)."""

import json
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from torch.utils.data import TensorDataset

from template_package.engine.resume.rng import gather_rows

from helpers.stand_in import StandInClassifier, StandInData, stand_in_net


class IndexedStandIn(StandInClassifier):
    """The stand-in without BatchNorm (its batch statistics are per device, so they differ with the number of
    processes), keeping each step's loss for RecordSteps."""

    def __init__(self, num_classes: int | None = None, in_channels: int | None = None, **recipe) -> None:
        super().__init__(num_classes, in_channels, **recipe)
        self.net = stand_in_net(num_classes, in_channels, dropout=0.0, batch_norm=False)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        images, targets, _ = batch
        self.step_loss = F.cross_entropy(self(images), targets)
        return self.step_loss


class PlainIndexed(L.LightningModule):
    """The stand-in's network as a plain LightningModule: plain AdamW, no schedule, Lightning's own clipping (the
    engine's default, by norm at 1.0), and on_before_optimizer_step counting the steps it acts on."""

    def __init__(self, num_classes: int | None = None, in_channels: int | None = None, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = stand_in_net(num_classes, in_channels, dropout=0.0, batch_norm=False)
        self.clipped_steps = 0

    def training_step(self, batch, batch_idx: int) -> Tensor:
        images, targets, _ = batch
        self.step_loss = F.cross_entropy(self.net(images), targets)
        return self.step_loss

    def on_before_optimizer_step(self, optimizer) -> None:
        norm = torch.nn.utils.get_total_norm([p.grad for p in self.parameters()])
        self.clipped_steps += bool(norm > self.trainer.gradient_clip_val)

    def on_train_end(self) -> None:
        if self.trainer.is_global_zero:
            print(f"clipped steps: {self.clipped_steps}")

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class IndexedStandInData(StandInData):
    """The stand-in's data, each training sample with its index."""

    def setup(self, stage: str) -> None:
        super().setup(stage)
        train = self.splits["train"]
        if len(train.tensors) == 2:
            self.splits["train"] = TensorDataset(*train.tensors, torch.arange(len(train)))


class RecordSteps(Callback):
    """Appends one JSON line to `path` for every optimizer step (rank 0): the step, the sorted indices of the samples
    every process read for it, and the mean loss of its batches over every process."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._indices: list[Tensor] = []
        self._losses: list[Tensor] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self._indices.append(batch[2])
        self._losses.append(pl_module.step_loss.detach())
        if len(self._indices) < trainer.accumulate_grad_batches:
            return
        indices, loss = torch.cat(self._indices), torch.stack(self._losses).mean()
        self._indices, self._losses = [], []
        if trainer.world_size > 1:
            indices = gather_rows(indices, trainer.world_size).flatten()
            loss = trainer.strategy.reduce(loss, reduce_op="mean")
        if trainer.is_global_zero:
            with self.path.open("a") as records:
                records.write(json.dumps({"step": trainer.global_step, "indices": sorted(indices.tolist()),
                                          "loss": loss.item()}) + "\n")  # fmt: skip


def recorded_steps(*paths: Path) -> dict[int, dict]:
    """The records of `paths` by step, a later file's over an earlier's (a resumed run trains the steps after its
    checkpoint again)."""
    steps = {}
    for path in paths:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            steps[record["step"]] = record
    return steps
