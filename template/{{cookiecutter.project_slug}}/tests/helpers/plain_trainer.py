"""A training script of the user's own, on a plain `lightning.Trainer` with the engine's `ExactResume` among its
callbacks, and what the tests need around it: `python -m helpers.plain_trainer DIR [--ckpt_path last] [--stop ...]`.

The module is a plain LightningModule written as Lightning's documentation and lightning-hydra-template write one:
dropout, Adam, two torchmetrics objects and the loss tensor updated in `training_step` and logged with on_epoch=True
(and the loss on_step too), a best-so-far metric reset in `on_train_start` and logged at each validation's end. Every
value the loggers receive is appended to DIR/logged.jsonl, as `(name, step, value)`, so a test compares a killed and
resumed run's with an uninterrupted run's.
"""

import argparse
import json
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from template_package.engine import ExactResume, Trainer

BATCHES = 12  # an epoch's batches


class MetricsModule(L.LightningModule):
    def __init__(self, hidden: int = 32, dropout: float = 0.3, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 4))
        self.train_acc, self.train_loss = MulticlassAccuracy(4, average="micro"), MeanMetric()
        self.val_acc, self.val_acc_best = MulticlassAccuracy(4, average="micro"), MaxMetric()

    def on_train_start(self) -> None:
        self.val_acc_best.reset()  # (as lightning-hydra-template's: the sanity check's value must not count)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.train_loss(loss)
        self.train_acc(logits, y)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        self.log("train/mean_loss", self.train_loss, on_step=False, on_epoch=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.val_acc(self.net(x), y)
        self.log("val/acc", self.val_acc)

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class PlainData(L.LightningDataModule):
    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(BATCHES * self.batch_size + 40, 8, generator=generator)
        y = (x[:, :2].sum(1) > 0).long() + 2 * (x[:, 2] > 0).long()
        self.train, self.val = TensorDataset(x[:-40], y[:-40]), TensorDataset(x[-40:], y[-40:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=20)


class Appended(Logger):
    """Appends every value it is given to a file, one JSON line each: what a run logged, kills and all."""

    name, version = "appended", 0

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    @rank_zero_only  # (as Lightning's loggers: the other processes' values are their own batches')
    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        with self.path.open("a") as file:
            for name, value in metrics.items():
                file.write(json.dumps([name, step, float(value)]) + "\n")

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass


def logged(run_dir: Path) -> dict[tuple[str, int], float]:
    """What the run logged, by (name, step): a step logged twice (by a killed run and again by its resumed run) must
    have logged the same value both times."""
    values: dict[tuple[str, int], float] = {}
    for line in (run_dir / "logged.jsonl").read_text().splitlines():
        name, step, value = json.loads(line)
        if name == "epoch":
            continue
        assert values.setdefault((name, step), value) == value, (
            f"{name} at step {step}: {value} and {values[name, step]}"
        )
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dir", type=Path)
    parser.add_argument("--ckpt_path", default=None)
    parser.add_argument("--callbacks", default="", help="extra callbacks as JSON [[module.Class, {init_args}], ...]")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--engine_trainer", action="store_true", help="the engine's Trainer, not Lightning's")
    parser.add_argument("--seed", default="0", help="seed_everything's; none: no seed (DIR/seed.txt says torch's); "
                        "torch:S: torch.manual_seed(S) alone")  # fmt: skip
    args = parser.parse_args(argv)
    import importlib

    extra = []
    for path, init_args in json.loads(args.callbacks or "[]"):
        module, name = path.rsplit(".", 1)
        extra.append(getattr(importlib.import_module(module), name)(**init_args))
    if args.seed == "none":
        (args.dir / "seed.txt").write_text(str(torch.initial_seed()))
    elif args.seed.startswith("torch:"):
        torch.manual_seed(int(args.seed.removeprefix("torch:")))
    else:
        L.seed_everything(int(args.seed))
    trainer_class = Trainer if args.engine_trainer else L.Trainer
    trainer = trainer_class(
        default_root_dir=args.dir, max_epochs=3, callbacks=[ExactResume(every_n_steps=5), *extra],
        logger=Appended(args.dir / "logged.jsonl"), log_every_n_steps=1, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=args.devices, strategy=args.strategy,
        deterministic=True, gradient_clip_val=None,
    )  # fmt: skip
    trainer.fit(MetricsModule(), PlainData(), ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
