"""A test-only callback that freezes training at a chosen point, so a test can SIGKILL or signal the process there.

It writes `marker` and stops the process with SIGSTOP: the test sees the marker and kills it from outside, the way
a crash or an out-of-memory kill would. With `until_signal` it waits, running, until a stop signal has reached it
instead: a stopped process is continued by whoever sends it SIGTERM (slurmstepd sends SIGCONT first), so a signal
sent to a frozen process could land a step later. Used by test_resume.py through `--trainer.callbacks+=`.
"""

import os
import signal
import sys
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback


class FreezeAt(Callback):
    """Freeze at `hook` once the trainer's global step reaches `step` (and, if given, at batch `batch_idx`).

    hook: on_train_batch_end, on_train_epoch_start, on_train_epoch_end or on_validation_batch_end (inside a checkpoint
    write: helpers.faults.StallingCheckpointIO). It freezes once per marker, so a requeued or restarted run with the
    same options goes on. flush_logs: flush the loggers first, so what was logged so far is on disk when the process is
    killed. uploaded: a run in object storage freezes once every file written so far is in the store.
    """

    def __init__(
        self,
        marker: str,
        hook: str,
        step: int = 0,
        batch_idx: int | None = None,
        flush_logs: bool = False,
        until_signal: bool = False,
        uploaded: bool = False,
    ) -> None:
        self.marker, self.hook, self.step, self.batch_idx = Path(marker), hook, step, batch_idx
        self.flush_logs, self.until_signal, self.uploaded = flush_logs, until_signal, uploaded

    def _freeze(self, trainer: L.Trainer) -> None:
        from template_package.engine.resume.exact_resume import ExactResume

        for callback in trainer.callbacks:  # a write in flight finishes first: its kill point is tested on its own
            if isinstance(callback, ExactResume):
                callback._wait_for_write()
        if self.flush_logs:
            for logger in trainer.loggers:
                logger.save()
        uploads = trainer.strategy.checkpoint_io.uploads if self.uploaded else None
        while uploads is not None and (uploads._queue or uploads._busy):
            time.sleep(0.05)
        self.marker.write_text(str(os.getpid()))
        self.hook = "done"
        if not self.until_signal:
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        from template_package.engine.resume.stop_signals import STOP_SIGNALS

        deadline = time.monotonic() + 300
        while STOP_SIGNALS.received is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def _maybe_freeze(self, trainer: L.Trainer, hook: str, batch_idx: int | None = None) -> None:
        if hook != self.hook or trainer.global_step < self.step or not trainer.is_global_zero:
            return
        if self.marker.exists():
            return  # frozen before: a requeued or restarted run goes on
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


class KillRankAt(Callback):
    """SIGKILLs this process, if it is global rank `rank`, at the end of the batch that brings the global step to
    `step`, the way a crash or the out-of-memory killer ends one rank of a job. Once per marker: it writes `marker`
    (the time of the kill) first, and a restarted process that finds it goes on."""

    def __init__(self, marker: str, rank: int, step: int) -> None:
        self.marker, self.rank, self.step = Path(marker), rank, step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank == self.rank and trainer.global_step >= self.step and not self.marker.exists():
            self.marker.write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)


class Say(Callback):
    """Prints `text` to stderr the first time `hook` runs (marks a moment in a run's output)."""

    def __init__(self, hook: str, text: str) -> None:
        self.text = text
        setattr(self, hook, self._say)

    def _say(self, *args, **kwargs) -> None:
        if self.text:
            print(self.text, file=sys.stderr)
            self.text = ""


class SlowDown(Callback):
    """Sleeps `seconds` after every training batch: a run long enough for a test to act on it (a kill once its
    checkpoint reached a store), with the same numbers as one that does not sleep."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)
