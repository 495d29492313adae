"""Linear warmup then cosine decay, stepped once per optimizer step. Plain PyTorch: no Lightning needed."""

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


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
    engine's Trainer does that for every WarmupCosineSchedule of a run when training starts (recipe.py,
    set_schedule_lengths); reading `trainer.estimated_stepping_batches` inside `configure_optimizers` builds the
    train loader too early and silently skips restoring its position on resume (Lightning issue #20550). Until then
    the LR is 0, and stepping the schedule raises: a forgotten call cannot train a whole run at LR 0.
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

    def set_total_steps(self, total_steps: int) -> None:
        """Fix the run's length in optimizer steps and set the LR of the current step accordingly."""
        self.warmup_steps = resolve_warmup_steps(self.warmup, total_steps)
        self.total_steps = total_steps
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_lr(self) -> list[float]:
        if self.total_steps is None:
            if self.last_epoch > 0:
                raise RuntimeError(
                    "WarmupCosineSchedule was stepped before it knew the run's length: call set_total_steps(steps) "
                    "first, or train with the engine's Trainer (or a TrainingRecipe module), which does"
                )
            return [0.0 for _ in self.base_lrs]
        factor = warmup_cosine_factor(self.last_epoch, self.warmup_steps, self.total_steps, self.min_lr_ratio)
        return [base_lr * factor for base_lr in self.base_lrs]
