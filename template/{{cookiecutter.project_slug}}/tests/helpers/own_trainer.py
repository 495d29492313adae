"""What tests/test_own_trainer.py runs: the files docs/own-trainer.md shows (`# <path>` on a code block's first line
names its file), and a project laid out as lightning-hydra-template's around them: its `train.py` (the template's, cut
to what a fit needs), its config groups, a module that keeps a network and optimizer partials out of its
hyperparameters, as the chapter says, and the engine copied into its `src/`."""

import re
import shutil
from pathlib import Path

import template_package

from helpers.cli import PROJECT_ROOT

CHAPTER = PROJECT_ROOT / "docs" / "own-trainer.md"
ENGINE = Path(template_package.__path__[0]) / "engine"


def chapter_files() -> dict[str, str]:
    """The chapter's code blocks that name their file, by path, with the package's name in its placeholder (the
    chapter unbaked) filled in."""
    text = re.sub(r"\{\{ *\w+\.package_name *\}\}", template_package.__name__, CHAPTER.read_text())
    blocks = re.findall(r"```\w+\n# (\S+)\n(.*?)```", text, re.DOTALL)
    return {path: body for path, body in blocks}


TRAIN = '''"""lightning-hydra-template's src/train.py, cut to what a fit needs (its rootutils call left out: the project
folder is on PYTHONPATH)."""
import hydra
import lightning as L
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="../configs", config_name="train.yaml")
def main(cfg: DictConfig) -> None:
    L.seed_everything(cfg.seed, workers=True)
    datamodule = hydra.utils.instantiate(cfg.data)
    model = hydra.utils.instantiate(cfg.model)
    callbacks = [hydra.utils.instantiate(config) for config in cfg.callbacks.values()]
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=False)
    trainer.fit(model=model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))


if __name__ == "__main__":
    main()
'''

MODULE = """import torch
import torch.nn.functional as F
from lightning import LightningModule
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy


class DenseNet(torch.nn.Module):
    def __init__(self, input_size: int, hidden: int, output_size: int) -> None:
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Linear(input_size, hidden), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                         torch.nn.Linear(hidden, output_size))

    def forward(self, x):
        return self.model(x)


class LitModule(LightningModule):
    def __init__(self, net, optimizer, scheduler, compile: bool) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net", "optimizer", "scheduler"])
        self.net, self.optimizer, self.scheduler = net, optimizer, scheduler
        self.train_loss, self.train_acc = MeanMetric(), MulticlassAccuracy(num_classes=4)
        self.val_acc, self.val_acc_best = MulticlassAccuracy(num_classes=4), MaxMetric()

    def on_train_start(self) -> None:
        self.val_acc_best.reset()

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        self.train_loss(loss)
        self.train_acc(logits.argmax(1), y)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_acc(self.net(x).argmax(1), y)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True)

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True)

    def configure_optimizers(self):
        optimizer = self.optimizer(params=self.trainer.model.parameters())
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.scheduler(optimizer=optimizer)}}
"""

DATA = """import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset


class Blobs(LightningDataModule):
    def __init__(self, batch_size: int = 32, samples: int = 3200) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)

    def setup(self, stage: str) -> None:
        x = torch.randn(self.hparams.samples + 256, 16, generator=torch.Generator().manual_seed(0))
        y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
        self.train, self.val = TensorDataset(x[:-256], y[:-256]), TensorDataset(x[-256:], y[-256:])

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=64)
"""

CONFIGS = {
    "configs/train.yaml": """defaults:
  - _self_
  - data: blobs
  - model: dense
  - callbacks: default
  - trainer: default
  - paths: default
task_name: train
seed: 12345
ckpt_path: null
""",
    "configs/data/blobs.yaml": "_target_: src.data.Blobs\nbatch_size: 32\n",
    "configs/model/dense.yaml": """_target_: src.models.LitModule
optimizer:
  _target_: torch.optim.Adam
  _partial_: true
  lr: 0.001
scheduler:
  _target_: torch.optim.lr_scheduler.StepLR
  _partial_: true
  step_size: 1
  gamma: 0.5
net:
  _target_: src.models.DenseNet
  input_size: 16
  hidden: 64
  output_size: 4
compile: false
""",
    "configs/callbacks/default.yaml": """defaults:
  - model_checkpoint
  - exact_resume
  - _self_
model_checkpoint:
  dirpath: ${paths.output_dir}/checkpoints
  filename: "epoch_{epoch:03d}"
  monitor: "val/acc"
  mode: "max"
  save_last: False
  auto_insert_metric_name: False
""",
    "configs/callbacks/model_checkpoint.yaml": """model_checkpoint:
  _target_: lightning.pytorch.callbacks.ModelCheckpoint
  dirpath: null
  filename: null
  monitor: null
  save_last: null
  save_top_k: 1
  mode: "min"
  auto_insert_metric_name: True
""",
    "configs/paths/default.yaml": "output_dir: ${hydra:runtime.output_dir}\n",
}


def hydra_project(folder: Path) -> Path:
    """The project, in `folder`: its configs (the chapter's among them), src/ with the engine copied in."""
    files = {**CONFIGS, **{path: body for path, body in chapter_files().items() if path.startswith("configs/")}}
    files |= {"src/__init__.py": "", "src/train.py": TRAIN, "src/models.py": MODULE, "src/data.py": DATA}
    for path, body in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(body)
    trainer = (folder / "configs" / "trainer" / "default.yaml").read_text()
    (folder / "configs" / "trainer" / "default.yaml").write_text(trainer.replace("max_epochs: 10", "max_epochs: 3"))
    shutil.copytree(ENGINE, folder / "src" / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    return folder
