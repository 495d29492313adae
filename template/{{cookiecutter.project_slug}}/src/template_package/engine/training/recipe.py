"""The training recipe, for any LightningModule: subclass `TrainingRecipe` instead of `LightningModule`.

What it gives the subclass, with nothing more to write than `training_step` returning the loss:
- AdamW (its `betas` and `eps` are options) in two parameter groups: weight matrices decay, biases and norm weights
  (1-D) do not, groups a fine-tuning callback adds later too (RecipeAdamW), and a rate of its own for a submodule
  (`lr_scale`);
- linear warmup then cosine (schedulers.WarmupCosineSchedule), stepped once per optimizer step, so it stays right
  for any gradient accumulation; the cosine ends at the run's length, which the engine's Trainer gives it, or at
  `decay_steps`;
- clipping by norm on unscaled gradients (under 16-mixed too, fused optimizers included), and what the training-loop
  guides ask to watch: `train/grad_norm`, the total norm before clipping, and `train/clip_share`, the share of
  optimizer steps since the last log that were clipped;
- `train/loss` (the mean over each optimizer step's global batch: its accumulation window, averaged over the
  processes at logged steps only, so the same curve on any number of processes) and `lr`, written at the steps
  Lightning writes `self.log`'s values at (steps.logs_at) straight to the loggers (through `self.log` each value
  would cost a round through Lightning's result collection every step);
- a stop before a NaN or infinite loss reaches the weights, so the last checkpoint stays the last good state.

A subclass that overrides one of the hooks below and still wants the recipe calls `super()` in it. Depends on torch,
lightning and schedulers.py and the engine's errors.py.
"""

import math

import lightning as L
import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from torch import Tensor, nn

from ..errors import NonFiniteLoss, UsageError
from ..internals import unscaled_yet, unscales_in_its_step
from .schedulers import LR_GROUP, WarmupCosineSchedule, resolve_warmup_steps
from .steps import logged_step, logs_at


def weight_decay_groups(
    module: nn.Module, weight_decay: float, lr: float | None = None, lr_scale: dict[str, float] | None = None
) -> list[dict]:
    """AdamW param groups: weights of linear and conv layers decay; biases and norm weights (1-D) do not.

    Decaying a bias or a LayerNorm/BatchNorm scale pulls it towards 0, which only hurts; decaying matrices
    regularises. (Embedding tables are 2-D and decay, as in GPT-2's and nanoGPT's recipes.) `lr_scale` maps a direct
    submodule's name to a factor of `lr`: its parameters get groups of their own, named after it (`backbone`). Only
    trainable parameters: a frozen one joins when a callback adds it (RecipeAdamW.add_param_group).
    """
    lr_scale = lr_scale or {}
    children = [name for name, _ in module.named_children()]
    unknown = sorted(set(lr_scale) - set(children))
    if unknown:
        raise UsageError(
            f"model.lr_scale names {', '.join(unknown)}, not a submodule of {type(module).__name__}: name one of "
            f"its direct submodules ({', '.join(children)})"
        )
    parts: dict[str | None, list[Tensor]] = {}
    for name, param in module.named_parameters():
        if param.requires_grad:
            child = name.split(".")[0]
            parts.setdefault(child if child in lr_scale else None, []).append(param)
    groups = []
    for name, params in sorted(parts.items(), key=lambda part: part[0] is not None):  # (unscaled first: `lr`)
        group = {"params": params} if name is None else {"params": params, "name": name, "lr": lr * lr_scale[name]}
        groups += decay_split(group, weight_decay)
    return groups


def decay_split(group: dict, weight_decay: float) -> list[dict]:
    """`group` by the decay rule: its matrices at its own weight_decay (else `weight_decay`), its 1-D tensors at 0.
    Split in two, the halves share one LR (schedulers.LR_GROUP) and the 1-D half's name ends in `.no_decay`."""
    params = [group["params"]] if isinstance(group["params"], Tensor) else list(group["params"])
    matrices, vectors = [p for p in params if p.ndim >= 2], [p for p in params if p.ndim < 2]
    name = group.get("name")
    if matrices and vectors and name is not None:
        halves = [{**group, LR_GROUP: name}, {**group, LR_GROUP: name, "name": f"{name}.no_decay"}]
    else:
        halves = [group, dict(group)]
    decays = (group.get("weight_decay", weight_decay), 0.0)
    return [
        {**half, "params": part, "weight_decay": decay}
        for half, part, decay in zip(halves, (matrices, vectors), decays, strict=True)
        if part
    ]


class RecipeAdamW(torch.optim.AdamW):
    """AdamW whose every param group follows the decay rule (decay_split), groups added after it was built too: the
    group a fine-tuning callback adds (Lightning's BaseFinetuning.unfreeze_and_add_param_group) is split inside
    `add_param_group`, so that the layout the callback stores for a resume is the optimizer's own. An added group
    without a name is named after its parameters' submodule (`backbone`), which names its LR in the logs."""

    def __init__(self, params, weight_decay: float, module: nn.Module | None = None, **kwargs) -> None:
        self.recipe_weight_decay = weight_decay
        super().__init__(params, weight_decay=weight_decay, **kwargs)
        self.module_names = {} if module is None else {id(p): name for name, p in module.named_parameters()}

    def add_param_group(self, param_group: dict) -> None:
        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        heads = {self.module_names[id(p)].split(".")[0] for p in params if id(p) in getattr(self, "module_names", {})}
        if "name" not in param_group and len(heads) == 1:
            param_group = {**param_group, "name": heads.pop()}
        for group in decay_split({**param_group, "params": params}, self.recipe_weight_decay) or [param_group]:
            super().add_param_group(group)


def set_schedule_lengths(trainer: L.Trainer) -> None:
    """Give every WarmupCosineSchedule of the run its length in optimizer steps, unless it has one (a resumed run
    keeps the length it started with) or needs none (its cosine ends at `decay_steps`). Called when training starts,
    by the engine's Trainer for any module and by TrainingRecipe for a plain Trainer, and not in
    `configure_optimizers`: reading `trainer.estimated_stepping_batches` there builds the train loader too early and
    silently skips restoring its position on resume (Lightning issue #20550)."""
    for config in trainer.lr_scheduler_configs:
        schedule = config.scheduler
        if not isinstance(schedule, WarmupCosineSchedule):
            continue
        if config.interval != "step":
            raise UsageError(
                "WarmupCosineSchedule is stepped once per epoch: it counts optimizer steps; return it from "
                "configure_optimizers as {'optimizer': ..., 'lr_scheduler': {'scheduler': ..., 'interval': 'step'}}"
            )
        if schedule.total_steps is not None or schedule.decay_steps is not None:
            continue
        total_steps = trainer.estimated_stepping_batches  # max_steps, or epochs x ceil(batches / accumulation)
        total_steps = min(total_steps, scheduled_accumulation_steps(trainer))
        if trainer.num_training_batches == float("inf") and trainer.max_steps == -1:
            raise UsageError(
                "the warmup-cosine schedule needs the run's length in optimizer steps, which a train loader without a "
                "length (a stream's) cannot give: set trainer.max_steps"
            )
        if total_steps == float("inf") or total_steps < 1:  # (max_epochs=-1 and no max_steps)
            raise UsageError(
                "the warmup-cosine schedule needs the run's length in optimizer steps: set trainer.max_steps or a "
                "finite trainer.max_epochs"
            )
        try:
            schedule.set_total_steps(int(total_steps))
        except ValueError as mistake:  # a warmup longer than the run
            raise UsageError(str(mistake)) from None


def scheduled_accumulation_steps(trainer: L.Trainer) -> float:
    """The optimizer steps of the run under Lightning's GradientAccumulationScheduler, which changes the accumulation
    per epoch (Lightning's estimate counts the first epoch's for every epoch); inf without one."""
    scheduler = next((c for c in trainer.callbacks if isinstance(c, GradientAccumulationScheduler)), None)
    batches, epochs = trainer.num_training_batches, trainer.max_epochs
    if scheduler is None or batches == float("inf") or epochs in (None, -1):
        return float("inf")
    steps = sum(math.ceil(batches / scheduler.get_accumulate_grad_batches(epoch)) for epoch in range(epochs))
    return steps if trainer.max_steps == -1 else min(steps, trainer.max_steps)


LOG_WINDOW = "recipe_log_window"  # the checkpoint's key for the counts since the last logged step


class LogWindow:
    """What the recipe gathers between two logged steps. A plain object: an attribute written on a LightningModule
    goes through nn.Module.__setattr__, which looks for parameters and submodules, at every step. The gradient norms
    stay on the device, and are compared with the clipping value only when a logged step (or a checkpoint) reads the
    clip share, so that a step adds no tensor operation and no sync."""

    FOLDED = 1000  # norms kept at most: beyond, they are counted (a run whose loggers never write)

    def __init__(self, clipped: int = 0, steps: int = 0) -> None:
        self.norms: list[Tensor] = []  # each optimizer step's total gradient norm since the last log
        self.clipped: int | Tensor = clipped  # clipped steps before `norms` (a resumed window's, folded ones)
        self.steps = steps  # optimizer steps before `norms`
        self.last_norm: Tensor | None = None
        self.metrics: dict[str, float | Tensor] = {}  # the logged step's metrics gathered so far
        self.loss: Tensor | None = None  # the accumulation window's loss so far, on the device
        self.step_at_batch_start = 0

    def add(self, norm: Tensor, clip_val: float | None) -> None:
        self.norms.append(norm)
        self.last_norm = norm
        if len(self.norms) >= self.FOLDED:
            self.clipped, self.steps = self.clip_counts(clip_val)
            self.norms = []

    def clip_counts(self, clip_val: float | None) -> tuple[int | Tensor, int]:
        """The clipped optimizer steps since the last log (by norm, at `clip_val`; None or 0: none) and all of
        them."""
        clipped = self.clipped
        if clip_val and self.norms:
            clipped = clipped + (torch.stack(self.norms) > clip_val).sum()
        return clipped, self.steps + len(self.norms)

    def restart(self) -> None:
        self.norms, self.clipped, self.steps = [], 0, 0


class TrainingRecipe(L.LightningModule):
    """A LightningModule with the project's training recipe (see the module docstring). A subclass takes the recipe's
    settings as keyword arguments and passes them on, so that they are options of its own (`--model.lr 0.01`):

        class MyModel(TrainingRecipe):
            def __init__(self, width: int = 64, **recipe) -> None:
                super().__init__(**recipe)
                self.save_hyperparameters()
                ...

    Args:
        lr: peak learning rate, reached at the end of warmup.
        weight_decay: AdamW decay of weight matrices; biases and norm weights never decay.
        warmup: linear warmup, as a share of the cosine's horizon (< 1: of the run, or of decay_steps) or a number of
            optimizer steps (>= 1).
        min_lr_ratio: the cosine ends at lr * min_lr_ratio (nanoGPT's min_lr / learning_rate).
        fused_optimizer: AdamW's fused implementation, one kernel for all parameters instead of a few per tensor
            (CUDA and CPU). Deterministic, so runs repeat and resume exactly, but its rounding differs from the
            default AdamW's: its runs are not bit-identical to runs without it.
        lr_scale: a factor of `lr` for a submodule's parameters, by its name (`{"backbone": 0.1}`: a pretrained
            backbone at a tenth of the head's rate). Its LR is logged as `lr/backbone`.
        betas: AdamW's decay rates of its running means of the gradient and of its square, each in [0, 1) (nanoGPT
            trains with [0.9, 0.99]: a lower second rate follows a change in the gradients' size sooner).
        eps: AdamW's epsilon, added to the root of the squared gradients' mean before it divides: it bounds the
            step of a parameter whose gradients are all tiny.
        decay_steps: the optimizer step at which the cosine reaches lr * min_lr_ratio; the rate stays there after
            it, however long the run (nanoGPT's lr_decay_iters), and a fractional warmup is a share of it. null:
            the run's length.
    """

    def __init__(
        self,
        lr: float = 3e-3,
        weight_decay: float = 0.05,
        warmup: float = 0.1,
        min_lr_ratio: float = 0.01,
        fused_optimizer: bool = False,
        lr_scale: dict[str, float] | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        decay_steps: int | None = None,
    ) -> None:
        super().__init__()
        check_settings(betas, eps, warmup, decay_steps)
        self.lr, self.weight_decay, self.warmup, self.min_lr_ratio = lr, weight_decay, warmup, min_lr_ratio
        self.fused_optimizer, self.lr_scale = fused_optimizer, dict(lr_scale or {})
        self.betas, self.eps, self.decay_steps = tuple(betas), eps, decay_steps
        self._log = LogWindow()

    def configure_optimizers(self):
        groups = weight_decay_groups(self, self.weight_decay, self.lr, self.lr_scale)
        fused = self.fused_optimizer or None  # None: torch's default
        optimizer = RecipeAdamW(
            groups, self.weight_decay, module=self, lr=self.lr, betas=self.betas, eps=self.eps, fused=fused
        )
        schedule = WarmupCosineSchedule(
            optimizer, self.warmup, min_lr_ratio=self.min_lr_ratio, decay_steps=self.decay_steps
        )
        # interval="step": Lightning steps the schedule once per optimizer step, i.e. after each full accumulation
        # window, so it counts optimizer steps, not batches. Without decay_steps, its length is set when training
        # starts.
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def on_fit_start(self) -> None:
        ratio_callbacks = [type(c).__name__ for c in self.trainer.callbacks if hasattr(c, "backbone_initial_ratio_lr")]
        if ratio_callbacks and "backbone" in self.lr_scale:
            raise UsageError(
                f"model.lr_scale sets the backbone's LR and so does {ratio_callbacks[0]}'s backbone_initial_ratio_lr: "
                "keep one (drop 'backbone' from model.lr_scale, or the callback)"
            )

    def on_train_start(self) -> None:
        set_schedule_lengths(self.trainer)  # (done already under the engine's Trainer; here for a plain Trainer)

    @property
    def grad_norm(self) -> Tensor | None:
        """The total gradient norm of the last optimizer step that computed it."""
        return self._log.last_norm

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """The logging window's counts for train/clip_share: a checkpoint inside a window (between two logged steps)
        resumes a run whose next logged share covers the whole window, as the uninterrupted run's does."""
        by_norm = self.trainer.gradient_clip_algorithm != "value"
        clipped, steps = self._log.clip_counts(self.trainer.gradient_clip_val if by_norm else None)
        checkpoint[LOG_WINDOW] = {"clipped_steps": int(clipped), "steps": steps}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        window = checkpoint.get(LOG_WINDOW, {"clipped_steps": 0, "steps": 0})  # (none in a checkpoint made before)
        self._log = LogWindow(window["clipped_steps"], window["steps"])

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        self._log.step_at_batch_start = self.trainer.global_step

    def on_before_backward(self, loss: Tensor) -> None:
        # Stop before a NaN/inf reaches the weights, so the last checkpoint stays the last good state. (One
        # device-to-host sync a step; a Python float is checked without another tensor op. Under 16-mixed the loss is
        # scaled here, which keeps a finite loss finite.)
        value = loss.item()
        if not math.isfinite(value):
            raise NonFiniteLoss(
                f"train/loss is {value} at global step {self.trainer.global_step}, batch "
                f"{self.trainer.fit_loop.epoch_loop.batch_progress.current.ready - 1} of epoch {self.current_epoch}: "
                "lower model.lr, check the inputs, or find the first bad operation with --trainer.detect_anomaly true"
            )

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip as Lightning does, by global norm or by value, on unscaled gradients, once per optimizer step, and
        keep the total norm before clipping for `train/grad_norm`: clip_grad_norm_'s own result when clipping by
        norm, so it costs nothing more; it stays on the device until a logged step reads it."""
        logging = logs_at(self.trainer, self.trainer.global_step)  # (it counts this optimizer step only after it)
        if logging:  # the rate this step is taken with (the schedule steps before on_train_batch_end)
            self._log.metrics = group_lrs(optimizer.param_groups)
        plugin = self.trainer.precision_plugin
        if type(plugin).clip_grad_by_norm is not Precision.clip_grad_by_norm:  # FSDP's or DeepSpeed's own clipping
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        by_value = gradient_clip_algorithm == "value"
        if not (gradient_clip_val or logging):
            return
        unscale_fused_gradients(plugin, optimizer)
        params = list(plugin.main_params(optimizer))
        norm_clip = gradient_clip_val if gradient_clip_val and not by_value else float("inf")
        if logging or not by_value:
            norm = torch.nn.utils.clip_grad_norm_(params, norm_clip)
            self._log.add(norm, gradient_clip_val if not by_value else None)
            if logging:
                self._log.metrics["train/grad_norm"] = norm
                clipped, steps = self._log.clip_counts(gradient_clip_val if not by_value else None)
                if not by_value:
                    self._log.metrics["train/clip_share"] = clipped / steps
                self._log.restart()
        if by_value and gradient_clip_val:
            torch.nn.utils.clip_grad_value_(params, gradient_clip_val)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        """After an optimizer step the loggers write: train/loss, lr and the gradient metrics (those two gathered
        before the step: at a stop decided after it, train/loss alone). Written straight to the loggers, as
        Lightning's own LearningRateMonitor does: these values are looked at, not monitored, so they are not in
        `trainer.callback_metrics`."""
        log = self._log
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, Tensor):  # Lightning divides each batch's loss by the accumulation: summed, their mean
            loss = loss.detach()
            log.loss = loss if log.loss is None else log.loss + loss
        if self.trainer.global_step == log.step_at_batch_start:  # inside an accumulation window: no optimizer step
            return
        window_loss, log.loss = log.loss, None
        step = logged_step(self.trainer)  # (Lightning's x-axis: steps.py)
        if not logs_at(self.trainer, step):
            return
        metrics, log.metrics = log.metrics, {}
        if window_loss is not None:  # every process's share of the global batch (every process logs the same steps)
            metrics["train/loss"] = self.trainer.strategy.reduce(window_loss, reduce_op="mean")
        values = {name: float(value) for name, value in metrics.items()}
        for logger in self.loggers:
            logger.log_metrics(values, step=step)


def check_settings(betas: tuple[float, float], eps: float, warmup: float, decay_steps: int | None) -> None:
    """AdamW's `betas` and `eps` and the schedule's horizon as they take them, or one line naming the value, when the
    module is built (their own errors come from configure_optimizers, with a traceback)."""
    if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
        raise UsageError(f"model.betas={list(betas)}: give AdamW two decay rates in [0, 1), e.g. [0.9, 0.999]")
    if eps < 0:
        raise UsageError(f"model.eps={eps} is negative: give AdamW's epsilon >= 0, e.g. 1e-8")
    if decay_steps is not None:
        try:
            resolve_warmup_steps(warmup, decay_steps, decay_steps=True)
        except ValueError as mistake:
            raise UsageError(str(mistake)) from None


def group_lrs(param_groups: list[dict]) -> dict[str, float]:
    """`lr`, the first group's rate, and `lr/<name>` for each named group with a rate of its own (the halves of one
    split group share theirs: schedulers.LR_GROUP)."""
    lrs = {"lr": param_groups[0]["lr"]}
    for group in param_groups:
        name = group.get(LR_GROUP, group.get("name"))
        if name is not None and name != param_groups[0].get(LR_GROUP, param_groups[0].get("name")):
            lrs.setdefault(f"lr/{name}", group["lr"])
    return lrs


def unscale_fused_gradients(plugin: Precision, optimizer) -> None:
    """Under 16-mixed, Lightning's MixedPrecision unscales the gradients before clipping, except for optimizers that
    unscale inside their own step (fused AdamW): clipped as they are, those gradients are still multiplied by the
    loss scale (norms thousands of times too large), so every step would be clipped to almost nothing. Unscaled
    here, GradScaler's step then tells the fused optimizer they are unscaled already."""
    scaler = getattr(plugin, "scaler", None) if isinstance(plugin, MixedPrecision) else None
    if scaler is None or not unscales_in_its_step(optimizer):
        return
    if isinstance(optimizer, LightningOptimizer):
        optimizer = optimizer.optimizer
    if not unscaled_yet(scaler, optimizer):
        scaler.unscale_(optimizer)
