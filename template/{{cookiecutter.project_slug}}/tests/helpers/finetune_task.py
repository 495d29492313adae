"""A pretrained backbone fine-tuned on the engine's recipe (tests/test_finetuning.py): a torch TransformerEncoder over
an image's rows (LayerNorms, biases, dropout), its weights saved to a file and loaded as users load a pretrained
model, and a linear head; Lightning's own BackboneFinetuning freezes and unfreezes it."""

from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import BaseFinetuning, Callback
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from template_package.engine import TrainingRecipe

WIDTH = 16


class Backbone(nn.Module):
    """8x8 images as 8 tokens of 8 pixels, 2 transformer layers, the tokens' mean; `batch_norm` adds a BatchNorm1d
    over the mean (for BaseFinetuning's train_bn=False, which switches its running statistics)."""

    def __init__(self, batch_norm: bool = False) -> None:
        super().__init__()
        self.embed = nn.Linear(8, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, nhead=2, dim_feedforward=32, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.norm = nn.BatchNorm1d(WIDTH) if batch_norm else nn.LayerNorm(WIDTH)

    def forward(self, images: Tensor) -> Tensor:
        return self.norm(self.encoder(self.embed(images.flatten(1, 2))).mean(dim=1))


def save_pretrained(path: Path, batch_norm: bool = False) -> Path:
    """A "pretrained" backbone's weights in a file: seeded, so every test's file holds the same ones."""
    torch.manual_seed(1234)
    torch.save(Backbone(batch_norm).state_dict(), path)
    return path


class FineTuned(TrainingRecipe):
    """The pretrained backbone and a new head on the training recipe."""

    def __init__(self, backbone_path: str, num_classes: int | None = None, batch_norm: bool = False, **recipe) -> None:
        super().__init__(**recipe)
        self.save_hyperparameters()
        self.backbone = Backbone(batch_norm)
        self.backbone.load_state_dict(torch.load(backbone_path, weights_only=True))
        self.head = nn.Linear(WIDTH, num_classes)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.backbone(images))

    def training_step(self, batch, batch_idx: int) -> Tensor:
        images, targets = batch
        return F.cross_entropy(self(images), targets)

    def validation_step(self, batch, batch_idx: int) -> None:
        images, targets = batch
        logits = self(images)
        self.val_acc.update(logits, targets)
        self.log("val/loss", F.cross_entropy(logits, targets))
        self.log("val/acc", self.val_acc)


def twice(epoch: int) -> float:
    """BackboneFinetuning's lambda_func: the backbone's rate doubles each epoch after the unfreeze."""
    return 2.0


class DoubleLrOnRestart(Callback):
    """A callback that sets training up differently on a restart: it doubles the first group's LR when a run
    resumes, after the checkpoint was restored (the kind of hook the resume check exists for)."""

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.ckpt_path:
            trainer.optimizers[0].param_groups[0]["lr"] *= 2


class EncoderFinetuning(BaseFinetuning):
    """A BaseFinetuning of a user's own: the backbone's encoder frozen, then unfrozen at `epoch` at the head's rate
    / 10 (unfreeze_and_add_param_group's default)."""

    def __init__(self, epoch: int = 1) -> None:
        super().__init__()
        self.epoch = epoch

    def freeze_before_training(self, pl_module) -> None:
        self.freeze(pl_module.backbone.encoder)

    def finetune_function(self, pl_module, current_epoch: int, optimizer) -> None:
        if current_epoch == self.epoch:
            self.unfreeze_and_add_param_group(pl_module.backbone.encoder, optimizer)
