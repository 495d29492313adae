"""Callbacks for what Lightning's own do not do: a `last.ckpt` that always holds the newest state, written atomically.

Lightning's `ModelCheckpoint(save_last=True)` combined with a monitored top-k rewrites `last.ckpt` only when a new
top-k file is written, and its writes are not atomic. `LastCheckpoint` is separate and simple: it writes every
`every_n_steps` optimizer steps and at the end of every training epoch, always to the same file, through a temporary
file in the same directory, fsync and rename, so a kill at any instant leaves a loadable `last.ckpt`.
"""

import os
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback


def fsync_replace(tmp_path: Path, path: Path) -> None:
    """Make `tmp_path` durable, rename it over `path` atomically, then make the rename itself durable."""
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp_path, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class LastCheckpoint(Callback):
    """Keeps `dirpath/last.ckpt` equal to the newest training state.

    Args:
        dirpath: folder of `last.ckpt`; the CLI sets it to `<default_root_dir>/checkpoints`.
        every_n_steps: also write after every this many optimizer steps (0: only at epoch ends). A write comes right
            after an optimizer step, never inside a gradient-accumulation window.
    """

    FILENAME = "last.ckpt"

    def __init__(self, dirpath: str, every_n_steps: int = 100) -> None:
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps={every_n_steps} must be >= 0 (0 writes only at epoch ends)")
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self._saved_at_step = -1

    @property
    def path(self) -> Path:
        return self.dirpath / self.FILENAME

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
            # A write killed half-way leaves only its temporary file behind; last.ckpt itself is intact.
            self.path.with_name(self.FILENAME + ".tmp").unlink(missing_ok=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A resumed run has just loaded this step's state: writing it again would be a write mid-window.
        self._saved_at_step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        # global_step counts optimizer steps: it does not move inside an accumulation window, so the
        # `_saved_at_step` check also keeps the batches of a window from writing again.
        if self.every_n_steps and step % self.every_n_steps == 0 and step != self._saved_at_step:
            self.save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save(trainer)

    def save(self, trainer: L.Trainer) -> None:
        """Write the trainer's full state to `last.ckpt` atomically (every rank must call it, rank 0 writes)."""
        if trainer.fast_dev_run or trainer.sanity_checking:
            return  # a smoke run must not replace a real run's checkpoint
        tmp_path = self.path.with_name(self.FILENAME + ".tmp")
        trainer.save_checkpoint(tmp_path, weights_only=False)
        if trainer.is_global_zero:
            fsync_replace(tmp_path, self.path)
        trainer.strategy.barrier("last_checkpoint")
        self._saved_at_step = trainer.global_step
