"""Another library's private names, in one place: each behind a small function that says why no public API serves.

An upgrade of a library that renames or changes one of them fails tests/test_ownership.py, which checks every entry of
`PINNED` against the installed libraries, so that the change shows in one place, by name. Depends on lightning and
torch.
"""

from dataclasses import dataclass

import lightning as L


@dataclass(frozen=True)
class Pinned:
    """A private name this module uses: `module.qualname` exists; with `attribute`, that class (or a base) sets or
    reads `self.<attribute>`; with `parameters`, the callable takes exactly these."""

    module: str
    qualname: str
    why: str
    attribute: str | None = None
    parameters: tuple[str, ...] | None = None


PINNED = [
    Pinned(
        "lightning.pytorch.loops.training_epoch_loop",
        "_TrainingEpochLoop",
        attribute="_batches_that_stepped",
        why="the step `self.log` writes at: no public counter of batches whose optimizer stepped",
    ),
    Pinned(
        "lightning.pytorch.loops.training_epoch_loop",
        "_TrainingEpochLoop._should_accumulate",
        parameters=("self",),
        why="whether this batch ends an accumulation window: no public equivalent",
    ),
    Pinned(
        "lightning.pytorch.trainer.trainer",
        "Trainer",
        attribute="_checkpoint_connector",
        why="the whole trainer state as a dict: `save_checkpoint` writes it to a file and returns nothing",
    ),
    Pinned(
        "lightning.pytorch.trainer.connectors.checkpoint_connector",
        "_CheckpointConnector.dump_checkpoint",
        parameters=("self", "weights_only"),
        why="as above",
    ),
    Pinned(
        "lightning.pytorch.callbacks",
        "WeightAveraging",
        attribute="_average_model",
        why="whether the averaged weights exist yet: no public accessor",
    ),
    Pinned(
        "lightning.pytorch.callbacks",
        "WeightAveraging._swap_models",
        parameters=("self", "pl_module"),
        why="puts the training weights back, as the callback does at a validation's end: no public method",
    ),
    Pinned(
        "lightning.pytorch.trainer.trainer",
        "Trainer",
        attribute="_logger_connector",
        why="whether the loggers write at this step: `log_every_n_steps` has no public test",
    ),
    Pinned(
        "lightning.pytorch.trainer.connectors.logger_connector.logger_connector",
        "_LoggerConnector.should_update_logs",
        why="as above",
    ),
    Pinned(
        "lightning.pytorch.trainer.trainer",
        "Trainer",
        attribute="_data_connector",
        why="`prepare_data` is called by the trainer through it: no hook runs around it",
    ),
    Pinned(
        "lightning.pytorch.trainer.connectors.data_connector",
        "_DataConnector.prepare_data",
        parameters=("self",),
        why="as above",
    ),
    Pinned(
        "torch.amp",
        "GradScaler",
        attribute="_per_optimizer_states",
        why="whether an optimizer's gradients are unscaled yet: GradScaler has no public query",
    ),
    Pinned(
        "torch.optim",
        "AdamW",
        attribute="_step_supports_amp_scaling",
        why="an optimizer that unscales inside its own step (fused): torch's own flag, no public one",
    ),
    Pinned(
        "torch.utils.data",
        "RandomSampler",
        attribute="_num_samples",
        why="whether the user gave num_samples: the public `num_samples` is the dataset's length otherwise",
    ),
]


def batches_that_stepped(trainer: L.Trainer) -> int:
    """The batches after which an optimizer stepped: the step Lightning's loggers write `self.log`'s values at."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def set_batches_that_stepped(trainer: L.Trainer, steps: int) -> None:
    """Move Lightning's logging step (an evaluation of a checkpoint logs at the step it was taken)."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = steps


def full_checkpoint(trainer: L.Trainer) -> dict:
    """The trainer's whole state, the dict `trainer.save_checkpoint` would write."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)


def swap_in_training_weights(callback, module: L.LightningModule) -> None:
    """During a validation, put the training weights back into `module` (a WeightAveraging swapped the averaged in)."""
    if callback._average_model is not None:
        callback._swap_models(module)


def logs_this_step(trainer: L.Trainer) -> bool:
    """Whether the loggers write at this training step (every `log_every_n_steps`, and at the last)."""
    return trainer._logger_connector.should_update_logs


def wrap_prepare_data(trainer: L.Trainer, wrap) -> None:
    """Run the trainer's call of `prepare_data` (the DataModule's and the module's) inside `wrap`."""
    trainer._data_connector.prepare_data = wrap(trainer._data_connector.prepare_data)


def unscales_in_its_step(optimizer) -> bool:
    """Whether the optimizer unscales gradients inside its own step (fused AdamW), so GradScaler leaves them scaled."""
    return getattr(optimizer, "_step_supports_amp_scaling", False)


def unscaled_yet(scaler, optimizer) -> bool:
    """Whether GradScaler has unscaled this optimizer's gradients in this step."""
    from torch.amp.grad_scaler import OptState

    return scaler._per_optimizer_states[id(optimizer)]["stage"] is not OptState.READY


def num_samples_given(sampler) -> bool:
    """Whether a RandomSampler was given a number of samples of its own."""
    return sampler._num_samples is not None


def accumulating(trainer: L.Trainer) -> bool:
    """Whether the current batch is inside an accumulation window (its optimizer does not step after it)."""
    return trainer.fit_loop.epoch_loop._should_accumulate()
