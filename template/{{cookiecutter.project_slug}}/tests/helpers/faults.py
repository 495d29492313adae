"""Test-only faults, given to a run through a `--config` file: checkpoint IOs that fail or stall part-way through a
write, and a callback that sends a signal to its own process at a chosen point of the run. Used by test_faults.py
and test_resume.py."""

import errno
import io
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from template_package.engine.resume.durable import DurableCheckpointIO


class FailingCheckpointIO(DurableCheckpointIO):
    """Fails the `fail_at`-th write (from 1) of a file whose name contains `name`, after writing half of it, with
    the OS error `errno_name`. Just before, it copies the file that write would replace to `copy_before`, so a test
    can check that the file stayed byte-identical."""

    def __init__(self, fail_at: int, name: str = "last.ckpt", errno_name: str = "EIO", copy_before: str = "") -> None:
        self.fail_at, self.name, self.errno_name, self.copy_before = fail_at, name, errno_name, copy_before
        self.count = 0
        self._this_write = threading.local()  # last.ckpt is written in a background thread, top-k files are not

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        self._this_write.fails = False
        if self.name in Path(path).name and self._fails(checkpoint):
            self._this_write.fails = True
            if self.copy_before and Path(path).exists():
                shutil.copyfile(path, self.copy_before)
        super().save_checkpoint(checkpoint, path, storage_options)

    def _fails(self, checkpoint: dict) -> bool:
        self.count += 1
        return self.count == self.fail_at

    def write(self, checkpoint: dict, file) -> None:
        if not self._this_write.fails:
            return super().write(checkpoint, file)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        file.write(buffer.getvalue()[: buffer.tell() // 2])
        file.flush()
        self.fail()

    def fail(self) -> None:
        code = getattr(errno, self.errno_name)
        raise OSError(code, os.strerror(code))


class StallingCheckpointIO(FailingCheckpointIO):
    """Stalls in the first write of last.ckpt for a step >= `step`: writes half the file, then `marker` (holding the
    PID), then waits until the process is killed. A test kills it there, or signals it."""

    def __init__(self, marker: str, step: int = 0) -> None:
        super().__init__(fail_at=0)
        self.marker, self.step = Path(marker), step

    def _fails(self, checkpoint: dict) -> bool:
        return checkpoint["global_step"] >= self.step and not self.marker.exists()

    def fail(self) -> None:
        self.marker.write_text(str(os.getpid()))
        while True:
            time.sleep(1)


class SignalAt(Callback):
    """Sends `signal_name` (SIGTERM, SIGUSR1, SIGINT) to this process once, at `hook`, once the global step has
    reached `step`. Hooks: setup, sanity_check (a batch of the sanity check), validation (a batch of a validation
    during training), on_train_batch_start, on_train_batch_end, on_train_epoch_end, teardown."""

    def __init__(self, hook: str, signal_name: str = "SIGTERM", step: int = 0) -> None:
        self.hook, self.signum, self.step, self.sent = hook, getattr(signal, signal_name), step, False

    def _maybe_signal(self, trainer: L.Trainer, hook: str) -> None:
        if hook == self.hook and trainer.global_step >= self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)

    def setup(self, trainer, pl_module, stage) -> None:
        self._maybe_signal(trainer, "setup")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._maybe_signal(trainer, "sanity_check" if trainer.sanity_checking else "validation")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._maybe_signal(trainer, "on_train_batch_start")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._maybe_signal(trainer, "on_train_batch_end")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._maybe_signal(trainer, "on_train_epoch_end")

    def teardown(self, trainer, pl_module, stage) -> None:
        self._maybe_signal(trainer, "teardown")
