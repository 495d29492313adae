"""A test-only callback that freezes training at a chosen point, so a test can SIGKILL the process right there.

It writes `marker` and stops the process with SIGSTOP: the test sees the marker and kills it from outside, the way
a crash or an out-of-memory kill would. Used by test_resume.py through `--trainer.callbacks+=`.
"""

import os
import signal
import threading
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback


class FreezeAt(Callback):
    """Freeze at `hook` once the trainer's global step reaches `step` (and, if given, at batch `batch_idx`).

    hook: on_train_batch_end, on_train_epoch_start, on_train_epoch_end, on_validation_batch_end, or checkpoint_write
    (freezes while `last.ckpt.tmp` is being written, i.e. inside a checkpoint write). flush_logs: flush the loggers
    first, so what was logged so far is on disk when the process is killed.
    """

    def __init__(
        self, marker: str, hook: str, step: int = 0, batch_idx: int | None = None, flush_logs: bool = False
    ) -> None:
        self.marker, self.hook, self.step, self.batch_idx = Path(marker), hook, step, batch_idx
        self.flush_logs = flush_logs

    def _freeze(self, trainer: L.Trainer) -> None:
        if self.flush_logs:
            for logger in trainer.loggers:
                logger.save()
        self.marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)

    def _maybe_freeze(self, trainer: L.Trainer, hook: str, batch_idx: int | None = None) -> None:
        if hook != self.hook or trainer.global_step < self.step or not trainer.is_global_zero:
            return
        if self.batch_idx is None or batch_idx == self.batch_idx:
            self._freeze(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._maybe_freeze(trainer, "on_train_batch_end", batch_idx)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._maybe_freeze(trainer, "on_train_epoch_start")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._maybe_freeze(trainer, "on_train_epoch_end")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self._maybe_freeze(trainer, "on_validation_batch_end", batch_idx)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if self.hook != "checkpoint_write" or trainer.global_step < self.step or not trainer.is_global_zero:
            return
        # This hook runs just before the bytes are written: a watcher thread freezes the process as soon as the
        # temporary file appears, i.e. while it is being written or fsynced, before the rename.
        tmp = Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt.tmp"
        self.hook = "done"

        def watch() -> None:
            while not tmp.exists():
                time.sleep(0.0001)
            self._freeze(trainer)

        threading.Thread(target=watch, daemon=True).start()
