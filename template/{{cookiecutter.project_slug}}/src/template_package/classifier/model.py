"""The LightningModule: cross-entropy training of a network from nets.py, AdamW and a per-step warmup-cosine LR.

Depends on torch, lightning, torchmetrics and the sibling modules nets.py and schedulers.py only, so it can be
copied into another package together with them. Metric names: train/loss, val/loss, val/acc, test/loss, test/acc, lr.
"""

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.plugins.precision import Precision
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from ..engine.errors import NonFiniteLoss, UsageError
from ..engine.schedulers import WarmupCosineSchedule
from .nets import create_net


def weight_decay_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW param groups: weights of linear and conv layers decay; biases and norm weights (1-D) do not.

    Decaying a bias or a BatchNorm scale pulls it towards 0, which only hurts; decaying matrices regularises.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]


class ImageClassifier(L.LightningModule):
    """Classifies images into `num_classes` classes.

    Args:
        arch: "small_cnn" or a torchvision model name, see nets.create_net.
        num_classes: number of classes; left at None, the CLI takes it from the DataModule.
        in_channels: image channels; left at None, the CLI takes it from the DataModule.
        pretrained: start a torchvision arch from ImageNet weights (downloads them).
        lr: peak learning rate, reached at the end of warmup.
        weight_decay: AdamW decay of weight matrices; biases and norm weights never decay.
        warmup: linear warmup, as a fraction of the run (< 1) or a number of optimizer steps (>= 1).
        min_lr_ratio: the cosine ends at lr * min_lr_ratio.
        label_smoothing: cross-entropy label smoothing.
        dropout: dropout before the head of small_cnn (0: none).
        compile: compile the network with torch.compile (in place, so checkpoints keep the plain parameter names
            and load into an uncompiled model): true, or a torch.compile mode such as "reduce-overhead", which
            replays each step's kernels as CUDA graphs (what pays for small models, whose steps are short next to
            the time it takes to launch their kernels one by one). Pays off on GPUs; the first steps are slow.
        channels_last: keep conv weights and input images in channels-last (NHWC) memory layout, which the
            tensor-core convolution kernels of mixed precision on CUDA read without transposing. Checkpoints load
            either way; see benchmarks/overhead.py for its measured effect.
        fused_optimizer: AdamW's fused implementation, one kernel for all parameters instead of a few per tensor
            (CUDA and CPU). Deterministic, so runs repeat and resume exactly, but its rounding differs from the default
            AdamW's: its runs are not bit-identical to runs without it (nor to benchmarks/reference_loop.py).
    """

    def __init__(
        self,
        arch: str = "small_cnn",
        num_classes: int | None = None,
        in_channels: int | None = None,
        pretrained: bool = False,
        lr: float = 3e-3,
        weight_decay: float = 0.05,
        warmup: float = 0.1,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.0,
        dropout: float = 0.0,
        compile: bool | str = False,
        channels_last: bool = False,
        fused_optimizer: bool = False,
    ) -> None:
        super().__init__()
        if num_classes is None or in_channels is None:
            raise UsageError("ImageClassifier needs num_classes and in_channels (the CLI takes them from the data)")
        self.save_hyperparameters()
        self.net = create_net(arch, num_classes, in_channels, pretrained, dropout)
        self._clipped_steps: Tensor | int = 0  # for train/clip_share: clipped optimizer steps since the last log
        self._steps_since_log = 0
        self._loss_to_log: Tensor | None = None
        self.grad_norm: Tensor | None = None  # the total gradient norm of the last step that computed it
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")

    def configure_model(self) -> None:
        if self.hparams.channels_last:
            self.net.to(memory_format=torch.channels_last)  # in place: the optimizer sees the same parameters
        if self.hparams.compile:
            mode = None if self.hparams.compile is True else self.hparams.compile
            self.net.compile(mode=mode)  # nn.Module.compile: unlike torch.compile(net), adds no "_orig_mod." to keys

    def forward(self, images: Tensor) -> Tensor:
        if self.hparams.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    def _loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(logits, targets, label_smoothing=self.hparams.label_smoothing)

    def _is_logging_step(self) -> bool:
        """Whether the step now being computed is logged: as Lightning decides for its step metrics, when (optimizer
        steps so far + 1) is a multiple of `log_every_n_steps`. The other steps compute nothing for the loggers."""
        every = self.trainer.log_every_n_steps
        return self.trainer.fast_dev_run or (every > 0 and (self.trainer.global_step + 1) % every == 0)

    def _log_step(self, metrics: dict[str, Tensor | float]) -> None:
        """Write the step's training metrics straight to the loggers, as Lightning's own LearningRateMonitor does.
        `self.log` costs about 0.6 ms of Python a value (its result collection), 3% of a digits step at four values
        every 10 steps, measured with benchmarks/overhead.py; these values are only looked at, not monitored, so they
        are not in `trainer.callback_metrics`. (The tensors are read here, on logged steps only.)"""
        values = {name: float(value) for name, value in metrics.items()}
        for logger in self.loggers:
            logger.log_metrics(values, step=self.global_step)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, targets = batch
        loss = self._loss(self(images), targets)
        # Stop before a NaN/inf reaches the weights, so the last checkpoint stays the last good state. (The check
        # costs one device-to-host sync a step.)
        if not torch.isfinite(loss):
            raise NonFiniteLoss(
                f"train/loss is {loss.item()} at global step {self.global_step}, batch {batch_idx} of epoch "
                f"{self.current_epoch}: lower model.lr, check the inputs, or find the first bad operation with "
                "--trainer.detect_anomaly true"
            )
        self._loss_to_log = loss.detach()  # logged with the optimizer step, see configure_gradient_clipping
        return loss

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip as Lightning does (by global norm, on unscaled gradients), once per optimizer step, and log the step
        there on the steps the logger writes: `train/loss` (of the accumulation window's last batch), `lr`, and what
        the training-loop guides ask to watch, `train/grad_norm`, the total norm before clipping, and
        `train/clip_share`, the share of optimizer steps since the last log that were clipped. The norm is
        clip_grad_norm_'s own result, so it costs nothing more, and it stays on the device until a logged step."""
        logging = self._is_logging_step()  # (global_step counts this optimizer step only after it)
        plugin = self.trainer.precision_plugin
        plain = type(plugin).clip_grad_by_norm is Precision.clip_grad_by_norm  # not FSDP's or DeepSpeed's own
        metrics = {}
        if gradient_clip_algorithm in (None, "norm") and plain and (gradient_clip_val or logging):
            norm = torch.nn.utils.clip_grad_norm_(plugin.main_params(optimizer), gradient_clip_val or float("inf"))
            self.grad_norm = norm
            if gradient_clip_val:  # counted on the device: no sync until a logged step reads it
                self._clipped_steps = self._clipped_steps + (norm > gradient_clip_val)
            self._steps_since_log += 1
            if logging:
                share = self._clipped_steps / self._steps_since_log
                metrics = {"train/grad_norm": norm, "train/clip_share": share}
                self._clipped_steps, self._steps_since_log = 0, 0
        else:  # clipping by value, FSDP, or nothing to do
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        if logging:
            lr = self.lr_schedulers().get_last_lr()[0]
            self._log_step({"train/loss": self._loss_to_log, "lr": lr, **metrics})

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, targets = batch
        logits = self(images)
        self.val_acc.update(logits, targets)
        self.log("val/loss", self._loss(logits, targets), prog_bar=True, sync_dist=True)  # the mean over all ranks
        self.log("val/acc", self.val_acc, prog_bar=True)
        return logits  # for callbacks, e.g. ConfusionMatrixImage

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        images, targets = batch
        logits = self(images)
        self.test_acc.update(logits, targets)
        self.log("test/loss", self._loss(logits, targets), sync_dist=True)
        self.log("test/acc", self.test_acc)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Class probabilities for each image of the batch."""
        images, _ = batch
        return self(images).softmax(dim=-1)

    def configure_optimizers(self):
        groups = weight_decay_groups(self, self.hparams.weight_decay)
        fused = self.hparams.fused_optimizer or None  # None: torch's default (foreach on CUDA)
        optimizer = torch.optim.AdamW(groups, lr=self.hparams.lr, fused=fused)
        # The run's length is set in on_train_start, see WarmupCosineSchedule.
        scheduler = WarmupCosineSchedule(optimizer, self.hparams.warmup, min_lr_ratio=self.hparams.min_lr_ratio)
        # interval="step": Lightning steps the schedule once per optimizer step, i.e. after each full
        # accumulation window, so the schedule counts optimizer steps, not batches.
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def flops_per_sample(self, image_shape: tuple[int, ...]) -> int:
        """FLOPs of training on one image of `image_shape` (C, H, W), forward and backward, for `perf/mfu` (see
        callbacks.Throughput): Lightning's `measure_flops` on a copy of the network built on the meta device, so
        counting allocates nothing and draws no random numbers (training draws the same with and without it).
        Counted on 2 images (BatchNorm refuses 1), halved."""
        hp = self.hparams
        with torch.device("meta"):
            net = create_net(hp.arch, hp.num_classes, hp.in_channels, False, hp.dropout)
            images = torch.empty(2, *image_shape)
        return measure_flops(net, lambda: net(images), lambda logits: logits.sum()) // 2

    def on_train_start(self) -> None:
        schedule = self.lr_schedulers()
        if schedule.total_steps is not None:
            # Resumed: the schedule keeps the length it started with, also when the run was made longer (its added
            # steps train at the final rate; a schedule stretched to the new length would jump back up). The
            # optimizer came back with the rates it was saved with: this model's lr, warmup and weight decay differ
            # from them only when the change was allowed (the CLI's --allow_change), and then they apply from here.
            schedule.base_lrs = [self.hparams.lr for _ in schedule.base_lrs]
            schedule.warmup, schedule.min_lr_ratio = self.hparams.warmup, self.hparams.min_lr_ratio
            schedule.optimizer.param_groups[0]["weight_decay"] = self.hparams.weight_decay
            schedule.set_total_steps(schedule.total_steps)
            return
        # Optimizer steps of the whole run: max_steps, or epochs x ceil(batches / accumulation), per device.
        total_steps = self.trainer.estimated_stepping_batches
        if total_steps == float("inf"):
            raise UsageError("the warmup-cosine schedule needs a finite run: set trainer.max_epochs or max_steps")
        try:
            schedule.set_total_steps(int(total_steps))
        except ValueError as mistake:  # a warmup longer than the run
            raise UsageError(str(mistake)) from None
