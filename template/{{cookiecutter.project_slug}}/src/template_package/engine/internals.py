"""Another library's private names, in one place: each behind a small function that says why no public API serves.

An upgrade of a library that renames or changes one of them fails tests/test_ownership.py, which checks every entry of
`PINNED` against the installed libraries, so that the change shows in one place, by name. Depends on lightning only.
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
    ),  # fmt: skip
    Pinned(
        "lightning.pytorch.loops.training_epoch_loop",
        "_TrainingEpochLoop._should_accumulate",
        parameters=("self",),
        why="whether this batch ends an accumulation window: no public equivalent",
    ),  # fmt: skip
]


def batches_that_stepped(trainer: L.Trainer) -> int:
    """The batches after which an optimizer stepped: the step Lightning's loggers write `self.log`'s values at."""
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def set_batches_that_stepped(trainer: L.Trainer, steps: int) -> None:
    """Move Lightning's logging step (an evaluation of a checkpoint logs at the step it was taken)."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = steps


def accumulating(trainer: L.Trainer) -> bool:
    """Whether the current batch is inside an accumulation window (its optimizer does not step after it)."""
    return trainer.fit_loop.epoch_loop._should_accumulate()
