"""Training patterns of users' own modules, written the way Lightning's documentation writes them and without the
engine's recipe: the engine's guarantees must hold for each of them.

- `ManualGAN`: manual optimization with two optimizers, each with a StepLR stepped in `on_train_epoch_end` (the usual
  Lightning pattern), dropout in the discriminator, no `train/loss` (it logs `train/g_loss` and `train/d_loss`), and
  state of its own changed in `on_validation_epoch_end`.
- `EpochHooksClassifier`: the stand-in classifier under automatic optimization, with state changed in
  `on_train_epoch_end` (it halves its learning rate) and in `on_validation_epoch_end`.
- `AveragingClassifier`: state changed in `on_train_batch_end` (an average of the weights); `SwapsForValidation`
  validates with that average, swapped in by its own hooks.
- `SlowValidation`: a callback that makes each validation batch take a while, for signals that arrive there.
- `WindowMeanLoss`: the stand-in classifier that logs the mean loss since its last logged step, from sums it keeps
  in memory only (a checkpoint between two logged steps loses them).
- `EpochMetricsClassifier`: Lightning's most common logging pattern, lightning-hydra-template's: torchmetrics
  objects updated in `training_step` and logged with the loss tensor on_epoch=True, and a best-so-far metric reset in
  `on_train_start`.
"""

import time

import torch
import torch.nn.functional as F
from lightning import Callback, LightningModule
from torch import Tensor, nn
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from helpers.stand_in import StandInClassifier


class ManualGAN(LightningModule):
    """A small GAN over the stand-in's 8x8 images (flattened), trained with manual optimization.

    Args:
        lr: both optimizers' learning rate, halved after every epoch by their StepLR schedules.
        clip: clip both networks' gradients with the configured clipping (`self.clip_gradients(...)` with the
            trainer's settings: the call the README names).
    """

    def __init__(self, lr: float = 2e-3, clip: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 64))
        self.discriminator = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
        self.register_buffer("validations", torch.zeros((), dtype=torch.int64))

    def training_step(self, batch, batch_idx: int) -> None:
        real = batch[0].flatten(1)
        g_optimizer, d_optimizer = self.optimizers()
        fake = self.generator(torch.randn(len(real), 16, device=self.device))

        d_loss = F.softplus(-self.discriminator(real)).mean() + F.softplus(self.discriminator(fake.detach())).mean()
        d_optimizer.zero_grad()
        self.manual_backward(d_loss)
        self._clip(d_optimizer)
        d_optimizer.step()

        g_loss = F.softplus(-self.discriminator(fake)).mean()
        g_optimizer.zero_grad()
        self.manual_backward(g_loss)
        self._clip(g_optimizer)
        g_optimizer.step()
        self.log_dict({"train/g_loss": g_loss, "train/d_loss": d_loss})

    def _clip(self, optimizer) -> None:
        if self.hparams.clip:  # the configured clipping, which Lightning applies only under automatic optimization
            self.clip_gradients(optimizer, self.trainer.gradient_clip_val, self.trainer.gradient_clip_algorithm)

    def validation_step(self, batch, batch_idx: int) -> None:
        self.log("val/d_real", torch.sigmoid(self.discriminator(batch[0].flatten(1))).mean())

    def on_validation_epoch_end(self) -> None:
        self.validations += 1  # state of its own, changed at the end of each validation

    def on_train_epoch_end(self) -> None:
        for schedule in self.lr_schedulers():
            schedule.step()

    def configure_optimizers(self):
        g_optimizer = torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr, betas=(0.5, 0.999))
        d_optimizer = torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr, betas=(0.5, 0.999))
        schedules = [torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5) for optimizer in (g_optimizer, d_optimizer)]
        return [g_optimizer, d_optimizer], schedules


class EpochHooksClassifier(StandInClassifier):
    """The stand-in classifier (automatic optimization, the recipe), halving its learning rate itself at every
    epoch end and counting its validations, the way a user's hooks change state."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.register_buffer("validations", torch.zeros((), dtype=torch.int64))

    def on_train_epoch_end(self) -> None:
        for group in self.trainer.optimizers[0].param_groups:
            group["initial_lr"] = group.get("initial_lr", group["lr"]) * 0.5  # the schedule's base: halved
        schedule = self.lr_schedulers()
        schedule.base_lrs = [base * 0.5 for base in schedule.base_lrs]

    def on_validation_epoch_end(self) -> None:
        self.validations += 1

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)


class SlowValidation(Callback):
    """Each validation batch of training takes `seconds` longer (a large validation set, say)."""

    def __init__(self, seconds: float = 5.0) -> None:
        self.seconds = seconds

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            time.sleep(self.seconds)


class AveragingClassifier(StandInClassifier):
    """The stand-in classifier keeping an average of its weights, updated in `on_train_batch_end` after every step
    (as timm's ModelEmaV2 is used in a LightningModule): state a module changes after Lightning's callbacks' own
    batch-end hooks."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.register_buffer("average", self._weights())

    def _weights(self) -> Tensor:
        return torch.cat([p.detach().flatten() for p in self.net.parameters()])

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        self.average.mul_(0.9).add_(self._weights(), alpha=0.1)


class SwapsForValidation(AveragingClassifier):
    """The averaging classifier validating with its average, swapped in at each validation's start and back at its
    end, as an EMA callback of the user's would: state that the engine cannot put back in a checkpoint taken during
    validation."""

    def _swap(self) -> None:
        current = self._weights()
        torch.nn.utils.vector_to_parameters(self.average.clone(), self.net.parameters())
        self.average.copy_(current)

    on_validation_epoch_start = on_validation_epoch_end = _swap


class WindowMeanLoss(StandInClassifier):
    """Logs `train/window_loss`, the mean training loss over the steps since the last logged one."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.loss_sum, self.losses = 0.0, 0

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.loss_sum, self.losses = self.loss_sum + loss.item(), self.losses + 1
        if (self.global_step + 1) % self.trainer.log_every_n_steps == 0:
            self.log("train/window_loss", self.loss_sum / self.losses)
            self.loss_sum, self.losses = 0.0, 0
        return loss


class EpochMetricsClassifier(StandInClassifier):
    """The stand-in classifier logging its epoch's accuracy and mean loss (torchmetrics objects) and its loss tensor
    with on_epoch=True from `training_step`, and its best validation accuracy so far at each validation's end."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.train_acc, self.train_mean = MulticlassAccuracy(10, average="micro"), MeanMetric()
        self.val_acc_best = MaxMetric()

    def on_train_start(self) -> None:
        self.val_acc_best.reset()  # (the sanity check's accuracy must not count)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        images, targets = batch
        logits = self(images)
        loss = F.cross_entropy(logits, targets)
        self.train_acc(logits, targets)
        self.train_mean(loss)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        self.log("train/mean_loss", self.train_mean, on_step=False, on_epoch=True)
        self.log("train/epoch_loss", loss, on_step=False, on_epoch=True)
        return loss

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute())
