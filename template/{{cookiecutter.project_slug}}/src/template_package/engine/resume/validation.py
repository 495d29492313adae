"""A checkpoint taken during a validation of training: the training state as validation found it.

A stop signal can arrive in a validation that takes longer than a scheduler's grace period (SLURM's KillWait,
Kubernetes' termination grace period). `LastCheckpoint` then saves at once, and the run resumed from that checkpoint
does the validation again from its first batch, so that its metrics, the best checkpoints and early stopping see the
whole of it. Nothing of training changes during validation but what validation itself does, and that is undone in the
checkpoint:

- the loop's progress: Lightning would resume the interrupted validation at its next batch, with the metrics of the
  batches before it lost; the checkpoint says that validation has not begun;
- the random generators: the ones validation found (resume/rng.py keeps them for this);
- Lightning's weight averaging (EMA, `WeightAveraging`), which swaps the averaged weights into the model for
  validation: they are swapped back first.

A callback of your own that changes the model for validation and changes it back at its end is not undone: the
guarantee kit's stop during validation finds it. Depends on lightning only.
"""

import lightning as L
from lightning.pytorch.callbacks import WeightAveraging

from ..internals import full_checkpoint, swap_in_training_weights


def in_validation(trainer: L.Trainer) -> bool:
    """Whether a validation of training (not the sanity check) is running."""
    return trainer.validating and trainer.state.fn == "fit" and not trainer.sanity_checking


def dump_checkpoint(trainer: L.Trainer) -> dict:
    """The trainer's full state; during a validation of training, as validation found it. The model is left with its
    training weights: a checkpoint is taken during validation only for a run that stops."""
    if not in_validation(trainer):
        return full_checkpoint(trainer)
    for callback in trainer.callbacks:
        if isinstance(callback, WeightAveraging):
            swap_in_training_weights(callback, trainer.lightning_module)  # as on_validation_epoch_end does
    checkpoint = full_checkpoint(trainer)
    progress = checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
    before = progress["total"]["completed"] - progress["current"]["completed"]  # this epoch's validations before it
    # Lightning's stage "restarted mid-evaluation" (started one batch more than processed), at its first batch.
    progress["total"] = {"ready": before + 1, "started": before + 1, "processed": before, "completed": before}
    progress["current"] = dict.fromkeys(progress["current"], 0)
    return checkpoint
