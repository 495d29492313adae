"""What the engine counts as a training step: Lightning's own x-axis, so that one run has one.

`self.log` writes a batch's metrics at Lightning's count of batches that stepped (internals.py): the batches after
which an optimizer stepped. Under automatic optimization that is `trainer.global_step`; under manual optimization
`global_step` counts every `optimizer.step()` (two a batch for a GAN) while the loggers count batches. The engine's
own metrics (train/loss, lr, perf/*), `last_checkpoint.every_n_steps` and the step a resumed run logs from all count
`training_steps`, so they line up with what the module logs; validate, test and predict of a checkpoint log at the
step it was taken (`log_at_the_checkpoints_step`), beside the run's own points. Depends on lightning only.
"""

import lightning as L

from ..internals import accumulating, batches_that_stepped, set_batches_that_stepped

KEY = "training_steps"  # in a checkpoint: the training steps done when it was taken (`training_steps`)


def training_steps(trainer: L.Trainer) -> int:
    """The training steps done so far, the current batch's included once its optimizer step is taken (Lightning
    counts it only after the batch's hooks, and after the validation that may follow it)."""
    loop = trainer.fit_loop.epoch_loop
    progress = loop.batch_progress.current
    batch_not_counted = (progress.processed > progress.completed or trainer.validating) and progress.processed > 0
    return batches_that_stepped(trainer) + (batch_not_counted and not accumulating(trainer))


def logged_step(trainer: L.Trainer) -> int:
    """The step at which the current (or, at an epoch end, the last) training batch's metrics are logged."""
    return training_steps(trainer) - 1


def logs_at(trainer: L.Trainer, step: int) -> bool:
    """Whether the loggers write the metrics of training step `step` (0-based): Lightning's rule for `self.log`'s step
    metrics, when step + 1 is a multiple of `log_every_n_steps` (0: never), at the step the run stops, and at every
    step of a fast_dev_run. The one rule for the engine's own metrics, so they sit at the steps the module's do."""
    every = trainer.log_every_n_steps
    return bool(trainer.fast_dev_run) or (every > 0 and ((step + 1) % every == 0 or trainer.should_stop))


def logs_this_step(trainer: L.Trainer) -> bool:
    """Whether the loggers write at the current training batch's step (logs_at; Lightning's own logger connector first
    works out the active loop, a cost at every step)."""
    return logs_at(trainer, batches_that_stepped(trainer))


def steps_in(checkpoint: dict) -> int:
    """The training steps a checkpoint was taken after: where a run resumed from it logs on (its global step for a
    checkpoint written before the engine recorded them, the same under automatic optimization)."""
    return checkpoint.get(KEY, checkpoint["global_step"])


def log_at_the_checkpoints_step(trainer: L.Trainer, checkpoint: dict) -> None:
    """An evaluation of a checkpoint logs its metrics at the step the checkpoint was taken, among the run's own points
    (Lightning would log them at step 0, among the run's first steps)."""
    set_batches_that_stepped(trainer, max(steps_in(checkpoint) - 1, 0))
