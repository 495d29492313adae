"""The run's settings that a module cannot see when it is built, given to it when training starts: the length of
every WarmupCosineSchedule (recipe.set_schedule_lengths), so that no module trains at LR 0, and the configured
clipping for a module that optimizes manually (manual.py). One callback, added by the engine's Trainer to every run.
Depends on lightning, recipe.py and manual.py.
"""

import lightning as L
from lightning.pytorch.callbacks import Callback

from .manual import ManualClipping
from .recipe import set_schedule_lengths


class RunSettings(Callback):
    """Gives the module the run's schedule length and, when it optimizes manually, the configured clipping."""

    def __init__(self) -> None:
        self.clipping = ManualClipping()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.clipping.put_back(trainer, stage)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        set_schedule_lengths(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self.clipping.batch_ended(trainer, pl_module)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.clipping.stop_watching()
