"""For a classifier, TensorBoard shows the validation confusion matrix after every validation; any other model is left
alone. Depends on torch, torchmetrics and lightning."""

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from ..training.steps import logged_step


class ConfusionMatrixImage(Callback):
    """Logs the validation confusion matrix to TensorBoard as a grayscale image, rows normalised (recall per class).

    Row i, column j: the share of class-i inputs predicted as j; a perfect model draws a white diagonal.

    It attaches to classifiers: a model with a `num_classes` hyperparameter whose validation_step returns the
    logits, (batch, num_classes), of (inputs, targets) batches. With any other model it stays silent.
    """

    def __init__(self, pixels_per_cell: int = 16) -> None:
        self.pixels_per_cell = pixels_per_cell
        self.matrix = None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from torchmetrics.classification import MulticlassConfusionMatrix

        num_classes = getattr(pl_module.hparams, "num_classes", None)
        self.matrix = None
        if isinstance(num_classes, int) and num_classes > 1:
            self.matrix = MulticlassConfusionMatrix(num_classes, normalize="true").to(pl_module.device)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.matrix is None:
            return
        targets = batch[1] if isinstance(batch, list | tuple) and len(batch) == 2 else None
        num_classes = self.matrix.num_classes
        if not isinstance(outputs, torch.Tensor) or not isinstance(targets, torch.Tensor) or targets.ndim != 1:
            self.matrix = None  # not a classifier's logits and targets: this model gets no confusion matrix
        elif outputs.shape != (len(targets), num_classes):
            self.matrix = None
        else:
            self.matrix.update(outputs.argmax(dim=-1), targets)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.matrix is None or self.matrix.update_count == 0:
            return
        matrix = self.matrix.compute().nan_to_num(0.0)  # syncs across ranks
        image = matrix.repeat_interleave(self.pixels_per_cell, 0).repeat_interleave(self.pixels_per_cell, 1)
        for logger in trainer.loggers:
            if trainer.is_global_zero and not trainer.sanity_checking and hasattr(logger.experiment, "add_image"):
                logger.experiment.add_image("val/confusion_matrix", image.unsqueeze(0).cpu(), logged_step(trainer))
