"""Linear warmup then cosine decay, stepped once per optimizer step. Plain PyTorch: no Lightning needed."""

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

LR_GROUP = "lr_group"  # a param group key: groups with the same value share one LR (see WarmupCosineSchedule)


def warmup_cosine_factor(step: int, warmup_steps: int, horizon: int, min_lr_ratio: float) -> float:
    """The LR multiplier before optimizer step `step` (0-based).

    Warmup rises linearly to 1.0 at `warmup_steps` without ever being 0, so no step is wasted; the cosine then
    falls to `min_lr_ratio` at `horizon` (the run's length, or a horizon of its own: WarmupCosineSchedule's
    `decay_steps`) and stays there. This is nanoGPT's `get_lr` with `min_lr = lr * min_lr_ratio` and
    `lr_decay_iters = horizon`.
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if step >= horizon:
        return min_lr_ratio
    progress = (step - warmup_steps) / (horizon - warmup_steps)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def resolve_warmup_steps(warmup: float, horizon: int, decay_steps: bool = False) -> int:
    """A `warmup` below 1 is a share of the horizon (the run's length, or `decay_steps` when `decay_steps` is True);
    from 1 up it is a count of optimizer steps."""
    if decay_steps and horizon < 1:
        raise ValueError(
            f"decay_steps={horizon} is not a number of optimizer steps >= 1: raise model.decay_steps, or set it to "
            "null (the run's length)"
        )
    if warmup < 0:
        raise ValueError(f"warmup={warmup} is negative: give a fraction of the run in [0, 1) or a step count >= 1")
    steps = round(warmup * horizon) if warmup < 1 else int(warmup)
    if warmup >= 1 and steps != warmup:
        raise ValueError(f"warmup={warmup} is neither a fraction in [0, 1) nor a whole number of steps")
    if steps >= horizon and decay_steps:
        raise ValueError(
            f"warmup of {steps} optimizer steps (warmup={warmup}) is not shorter than decay_steps={horizon}, where "
            "the cosine ends: lower model.warmup or raise model.decay_steps"
        )
    if steps >= horizon:
        raise ValueError(
            f"warmup of {steps} optimizer steps (warmup={warmup}) is not shorter than the whole run of "
            f"{horizon} optimizer steps: lower model.warmup or train longer"
        )
    return steps


class WarmupCosineSchedule(LRScheduler):
    """Per-step warmup-cosine schedule (warmup_cosine_factor) on every param group's initial LR.

    The cosine ends at `decay_steps` when it is given (nanoGPT's `lr_decay_iters`: after it the rate stays at its
    floor, however long the run; a fractional warmup is a share of it), else at the run's length, `total_steps`. That
    may be left as None and given later with `set_total_steps`, once the run's length is known: the engine's Trainer
    does that for every WarmupCosineSchedule of a run when training starts (recipe.set_schedule_lengths says why
    then). Until the schedule knows where its cosine ends the LR is 0, and stepping it raises: a forgotten call cannot
    train a whole run at LR 0.

    The schedule owns every group's LR, groups added later included (a fine-tuning callback's): a group added at
    step s joins with base LR = its LR / the factor at s, and an LR written into a group between steps (one that is
    not the schedule's) becomes its base LR the same way, before the optimizer steps: the written LR is the one that
    trains, and the schedule goes on from it. Groups with the same `LR_GROUP` value are one group split by decay rule
    (recipe.RecipeAdamW): a write to one applies to all.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        warmup: float,
        total_steps: int | None = None,
        min_lr_ratio: float = 0.0,
        decay_steps: int | None = None,
    ) -> None:
        self.warmup, self.min_lr_ratio, self.decay_steps = warmup, min_lr_ratio, decay_steps
        self.total_steps = total_steps
        self.warmup_steps = self._resolved_warmup()
        super().__init__(optimizer)
        optimizer.register_step_pre_hook(self._before_optimizer_step)

    @property
    def horizon(self) -> int | None:
        """The optimizer step from which the rate stays at its floor: `decay_steps`, else the run's length."""
        return self.total_steps if self.decay_steps is None else self.decay_steps

    def _resolved_warmup(self) -> int:
        if self.horizon is None:
            return 0
        return resolve_warmup_steps(self.warmup, self.horizon, decay_steps=self.decay_steps is not None)

    def _before_optimizer_step(self, optimizer: Optimizer, args, kwargs) -> None:
        self._adopt_written_lrs()  # (the step about to be taken trains with the written rate)

    def set_total_steps(self, total_steps: int) -> None:
        """Fix the run's length in optimizer steps and set the LR of the current step accordingly."""
        self.total_steps = total_steps
        self.refresh()

    def refresh(self) -> None:
        """Set the current step's LR from the settings (`warmup`, `min_lr_ratio`, `decay_steps`, the run's length)
        after one of them changed: a run resumed with a change allowed (resume/changes.py) goes on with the new
        ones."""
        self.warmup_steps = self._resolved_warmup()
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
        if self.horizon is None:
            return 0.0
        return warmup_cosine_factor(step, self.warmup_steps, self.horizon, self.min_lr_ratio)

    def get_lr(self) -> list[float]:
        if self.horizon is None:
            if self.last_epoch > 0:
                raise RuntimeError(
                    "WarmupCosineSchedule was stepped before it knew the run's length: call set_total_steps(steps) "
                    "first (or give it decay_steps), or train with the engine's Trainer (or a TrainingRecipe module), "
                    "which does"
                )
            return [0.0 for _ in self.base_lrs]
        factor = self._factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]
