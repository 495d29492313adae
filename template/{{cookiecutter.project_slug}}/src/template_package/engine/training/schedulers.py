"""Linear warmup then cosine decay, stepped once per optimizer step. Plain PyTorch: no Lightning needed."""

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

LR_GROUP = "lr_group"  # a param group key: groups with the same value share one LR (see WarmupCosineSchedule)


def warmup_cosine_factor(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """The LR multiplier before optimizer step `step` (0-based).

    Warmup rises linearly to 1.0 at `warmup_steps` without ever being 0, so no step is wasted; the cosine then
    falls to `min_lr_ratio` at `total_steps` and stays there.
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if step >= total_steps:
        return min_lr_ratio
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def resolve_warmup_steps(warmup: float, total_steps: int) -> int:
    """A `warmup` below 1 is a fraction of the run; from 1 up it is a count of optimizer steps."""
    if warmup < 0:
        raise ValueError(f"warmup={warmup} is negative: give a fraction of the run in [0, 1) or a step count >= 1")
    steps = round(warmup * total_steps) if warmup < 1 else int(warmup)
    if warmup >= 1 and steps != warmup:
        raise ValueError(f"warmup={warmup} is neither a fraction in [0, 1) nor a whole number of steps")
    if steps >= total_steps:
        raise ValueError(
            f"warmup of {steps} optimizer steps (warmup={warmup}) is not shorter than the whole run of "
            f"{total_steps} optimizer steps: lower model.warmup or train longer"
        )
    return steps


class WarmupCosineSchedule(LRScheduler):
    """Per-step warmup-cosine schedule on every param group's initial LR.

    `total_steps` may be left as None and given later with `set_total_steps`, once the run's length is known: the
    engine's Trainer does that for every WarmupCosineSchedule of a run when training starts (recipe.set_schedule_lengths
    says why then). Until then the LR is 0, and stepping the schedule raises: a forgotten call cannot train a whole
    run at LR 0.

    The schedule owns every group's LR, groups added later included (a fine-tuning callback's): a group added at
    step s joins with base LR = its LR / the factor at s, and an LR written into a group between steps (one that is
    not the schedule's) becomes its base LR the same way, before the optimizer steps: the written LR is the one that
    trains, and the schedule goes on from it. Groups with the same `LR_GROUP` value are one group split by decay rule
    (recipe.RecipeAdamW): a write to one applies to all.
    """

    def __init__(
        self, optimizer: Optimizer, warmup: float, total_steps: int | None = None, min_lr_ratio: float = 0.0
    ) -> None:
        self.warmup = warmup
        self.min_lr_ratio = min_lr_ratio
        self.total_steps: int | None = None
        self.warmup_steps = 0
        if total_steps is not None:
            self.warmup_steps = resolve_warmup_steps(warmup, total_steps)
            self.total_steps = total_steps
        super().__init__(optimizer)
        optimizer.register_step_pre_hook(self._before_optimizer_step)

    def _before_optimizer_step(self, optimizer: Optimizer, args, kwargs) -> None:
        self._adopt_written_lrs()  # (the step about to be taken trains with the written rate)

    def set_total_steps(self, total_steps: int) -> None:
        """Fix the run's length in optimizer steps and set the LR of the current step accordingly."""
        self.warmup_steps = resolve_warmup_steps(self.warmup, total_steps)
        self.total_steps = total_steps
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr

    def get_last_lr(self) -> list[float]:
        """The LR each group trains with at the current step: the schedule's, or one written since (see the class
        docstring)."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def step(self, epoch: int | None = None) -> None:
        if self.last_epoch >= 0:  # (not at the step LRScheduler's own __init__ takes, from last_epoch -1)
            self._adopt_written_lrs()
        super().step(epoch)

    def _adopt_written_lrs(self) -> None:
        """Base LRs for groups added since the last step and for LRs written since then: an LR other than the one the
        schedule gives the group at this step (see the class docstring)."""
        groups = self.optimizer.param_groups
        factor = self._factor(self.last_epoch)
        written = {}
        for index, group in enumerate(groups):
            if index >= len(self.base_lrs) or group["lr"] != self.base_lrs[index] * factor:
                written.setdefault(group.get(LR_GROUP, index), group["lr"])
        if not written:
            return
        self.base_lrs = list(self.base_lrs) + [0.0] * (len(groups) - len(self.base_lrs))
        for index, group in enumerate(groups):
            lr = written.get(group.get(LR_GROUP, index))
            if lr is not None:
                group["lr"] = lr
                self.base_lrs[index] = lr / factor if factor else lr

    def _factor(self, step: int) -> float:
        if self.total_steps is None:
            return 0.0
        return warmup_cosine_factor(step, self.warmup_steps, self.total_steps, self.min_lr_ratio)

    def get_lr(self) -> list[float]:
        if self.total_steps is None:
            if self.last_epoch > 0:
                raise RuntimeError(
                    "WarmupCosineSchedule was stepped before it knew the run's length: call set_total_steps(steps) "
                    "first, or train with the engine's Trainer (or a TrainingRecipe module), which does"
                )
            return [0.0 for _ in self.base_lrs]
        factor = self._factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]
