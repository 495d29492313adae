"""`last.ckpt`: the state a preempted or crashed run resumes from, what Lightning's own callbacks do not keep.

`LastCheckpoint` keeps `last.ckpt` at most `every_n_steps` optimizer steps behind training (or writes the state of
every epoch that has fully ended, with `every_n_steps=0`), the final state once training ends, and the state at a
stop signal (SIGTERM, SIGUSR1, Ctrl-C; see stop_signals.py). Lightning's `ModelCheckpoint(save_last=True)` with a
monitored top-k rewrites it only when a new top-k file is written. This one writes atomically (durable.py: temporary
file, fsync, rename), so a kill, a crash or a full disk at any instant leaves a loadable `last.ckpt`, and only once
every step before the checkpoint's is logged. Training pays only for a copy of the state: serialisation, fsyncs
and the rename run in a background thread.

When it is written, all decided here: after an optimizer step whose count (training/steps.py) reaches a multiple of
`every_n_steps`, never inside a gradient-accumulation window, and one due on an epoch's last batch at that epoch's
end, after its validation and the module's epoch-end hook; at every epoch's end with `every_n_steps=0`; when training
ends, whatever ended it; at a stop signal, after the current optimizer step (or, during a validation, the training
state as the validation found it: validation.py). A run resumed from an epoch's end goes on with the next epoch
(finished_epochs.py).

Depends on torch, lightning and the engine's durable.py, finished_epochs.py, stop_signals.py and errors.py.
"""

import signal
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning.pytorch.strategies import Strategy
from lightning_utilities.core.apply_func import apply_to_collection

from ..errors import UsageError
from ..training.steps import KEY as STEPS
from ..training.steps import steps_in, training_steps
from .durable import CheckpointWriteError, DurableCheckpointIO
from .finished_epochs import keep_finished_epochs_finished
from .remote_run import is_url, redacted
from .stop_signals import STOP_SIGNALS
from .validation import dump_checkpoint


def snapshot(checkpoint: dict) -> tuple[dict, torch.cuda.Event | None]:
    """A copy of `checkpoint` that training cannot change: CPU tensors cloned, CUDA tensors copied to pinned host
    memory without waiting for the GPU; the event (None without CUDA tensors) marks when those copies are done."""
    on_cuda = False

    def copy(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal on_cuda
        if tensor.is_cuda:
            on_cuda = True
            return tensor.detach().to("cpu", non_blocking=True)  # a non-blocking device-to-host copy pins its target
        return tensor.detach().clone()

    state = apply_to_collection(checkpoint, torch.Tensor, copy)  # containers are rebuilt, so they are copies too
    if not on_cuda:
        return state, None
    event = torch.cuda.Event()
    event.record()
    return state, event


class LastCheckpoint(Checkpoint):
    """Keeps `dirpath/last.ckpt` at most `every_n_steps` training steps behind training, writes the final state when
    training ends (whatever ended it), and saves the state before a stopped run exits.

    It is a Lightning `Checkpoint`, so Lightning calls its epoch-end hook after the module's own and after the other
    callbacks' (as for its ModelCheckpoint): a state saved at an epoch's end holds everything the epoch's end changed
    (schedules a module steps in `on_train_epoch_end`, say), and a run resumed from it goes on with the next epoch.

    Args:
        dirpath: folder of `last.ckpt`; the CLI sets it to `<default_root_dir>/checkpoints`.
        every_n_steps: write whenever the training step count (training/steps.py: optimizer steps under automatic
            optimization, batches under manual optimization, the x-axis of the logs) reaches a multiple of this (0: at
            every epoch end instead). A write comes right after an optimizer step, never inside a
            gradient-accumulation window; one due on an epoch's last batch is made at the epoch end, after validation.
            The default, 1000, bounds the loss on a crash, not on preemption (a stop signal saves the current step).
            Each write copies the whole state: keep writes far enough apart that they cost little beside training.

    On SIGTERM, SIGUSR1 (what SLURM and Kubernetes send before they stop a job) or Ctrl-C, training finishes the
    current optimizer step (or the current validation batch), writes `last.ckpt` and exits with 128 + the signal
    number (143, 138, 130), so that a scheduler sees a failure and requeues the job; `fit --ckpt_path last` then
    resumes it exactly (a validation that was interrupted is done again, from its start). A write that fails (a full
    disk, say) stops the run at the next optimizer step with `durable.CheckpointWriteError`; `last.ckpt` keeps the
    previous state, byte for byte.
    """

    FILENAME = "last.ckpt"

    shown: str | None = None  # how its file is named in what it prints: a run in object storage's URL (set by the CLI)

    def __init__(self, dirpath: str, every_n_steps: int = 1000) -> None:
        if every_n_steps < 0:
            raise UsageError(f"every_n_steps={every_n_steps} must be >= 0 (0 writes at every epoch end)")
        if is_url(dirpath):
            raise UsageError(
                f"LastCheckpoint(dirpath={redacted(str(dirpath))!r}) is a URL: give it a local folder (the CLI keeps a "
                "run directory in object storage through a local one, resume/remote_run.py)"
            )
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps
        self._saved_at = -1  # the training steps of the state last staged, or of the checkpoint resumed
        self._staged_here: int | None = None  # the training steps of the state this process staged last
        self._staged: tuple[dict, torch.cuda.Event | None] | None = None  # a state waiting to be written
        self._io = DurableCheckpointIO()
        self._writer: ThreadPoolExecutor | None = None  # rank 0's writes, one at a time
        self._write: Future | None = None
        self._step_at_batch_start = -1
        self._exit_code: int | None = None
        self._owns_signals = False

    @property
    def path(self) -> Path:
        return self.dirpath / self.FILENAME

    @property
    def tmp_path(self) -> Path:
        return self.dirpath / (self.FILENAME + ".tmp")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        checkpoint_io = trainer.strategy.checkpoint_io
        if isinstance(checkpoint_io, AsyncCheckpointIO):
            raise UsageError(
                "trainer.plugins: AsyncCheckpointIO returns before a checkpoint is written, so last.ckpt could be "
                "renamed into place half-written; leave it out (last.ckpt is already written in the background)"
            )
        if isinstance(checkpoint_io, DurableCheckpointIO):
            self._io = checkpoint_io
        keep_finished_epochs_finished(trainer)  # (its epoch-end states resume exactly with max_steps set too)
        if not STOP_SIGNALS.installed:  # the CLI installs them at start-up; a plain Trainer gets them here
            STOP_SIGNALS.install()
            self._owns_signals = True
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
            # A write killed half-way leaves only its temporary file behind; last.ckpt itself is intact.
            self.tmp_path.unlink(missing_ok=True)
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="last-checkpoint")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[STEPS] = training_steps(trainer)  # where a run resumed from it logs on (cli/run_directory.py)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._saved_at = steps_in(checkpoint)  # writing this state again would be a write mid-window
        # No sanity check in a resumed run: the run's start made it, and Lightning skips it mid-epoch itself, but at an
        # epoch boundary it would run the module's validation hooks once more than the run that never stopped did.
        trainer.num_sanity_val_steps = 0

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        STOP_SIGNALS.install()  # take the signals back from the handler Lightning has just installed

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_at = max(self._saved_at, 0)
        STOP_SIGNALS.install()
        STOP_SIGNALS.defer()  # from now on a signal is saved at the next optimizer step, see after_the_batch
        # Lightning calls every callback's on_train_batch_end before the module's own, where a module may change its
        # state (an EMA of its weights, say): the state of a step is taken after the module's hook.
        module_hook = pl_module.on_train_batch_end

        def then_the_checkpoint(outputs, batch, batch_idx: int) -> None:
            module_hook(outputs, batch, batch_idx)
            self.after_the_batch(trainer)

        pl_module.on_train_batch_end = then_the_checkpoint

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_staged_then_exit_if_stopping(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._write_staged_then_exit_if_stopping(trainer)
        self._step_at_batch_start = trainer.global_step

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_staged_then_exit_if_stopping(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        """A signal during a validation of training stops it within a batch: the state saved is the training state
        as validation found it (validation.py), and the resumed run does the validation again."""
        if trainer.sanity_checking or not STOP_SIGNALS.deferred or not self._stopping(trainer):
            return
        self._stage(trainer)
        self._exit_code = STOP_SIGNALS.exit_code or 128 + signal.SIGTERM
        self._write_staged_then_exit_if_stopping(trainer)

    def after_the_batch(self, trainer: L.Trainer) -> None:
        """After a training batch's hooks, the module's own included (see on_train_start)."""
        if trainer.global_step == self._step_at_batch_start:
            return  # inside an accumulation window: the optimizer has not stepped, the state is not a step's state
        stopping = self._stopping(trainer)  # (raises at once if a write failed)
        if trainer.is_last_batch:
            # A checkpoint taken after an epoch's last batch, before its validation and end, resumes inexactly
            # (tests/test_resume.py): a write due now, or a stop, is made at the epoch end instead.
            return
        # The state is taken now but written at the next hook: Lightning logs (and flushes) this step's metrics
        # only after this hook, and a resumed run never logs the steps before its checkpoint again. The step where
        # max_steps ends training is saved here too: the state Lightning leaves at the end of training counts the
        # interrupted epoch as finished, and a run resumed from it with a larger max_steps trained nothing.
        ends = self._training_ends(trainer)
        if ends or stopping or self._is_due(training_steps(trainer), epoch_end=False):
            self._stage(trainer)
        if stopping and not ends:  # (when training ends anyway, the process exits with the signal's code after it)
            self._exit_code = STOP_SIGNALS.exit_code or 128 + signal.SIGTERM

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After the module's own epoch-end hook and every other callback's (a Checkpoint's place). The state staged
        here is written at the next hook, once Lightning has logged the epoch's metrics; a signal during the epoch's
        last batch or its validation stops there, unless training ends anyway: then on_train_end writes the final
        state, and the process exits with the signal's code after it."""
        self._write_staged_then_exit_if_stopping(trainer)
        if self._training_ends(trainer):
            return  # (the last epoch's state is written by on_train_end, with the epoch counted as done)
        if self._stopping(trainer):
            self._stage(trainer)
            self._exit_code = STOP_SIGNALS.exit_code or 128 + signal.SIGTERM
        elif self._is_due(training_steps(trainer), epoch_end=True):
            self._stage(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The final state, whether max_epochs, early stopping or max_time ended training (max_steps mid-epoch was
        # saved at its step). Saved here rather than at the last epoch end: an EarlyStopping that checks at epoch
        # ends may stop a run there that has epochs left.
        self._write_staged(trainer)
        # (A run resumed from a checkpoint taken during validation validates again without a step: written too.)
        if training_steps(trainer) != self._staged_here:
            self._stage(trainer)
            self._write_staged(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        vars(pl_module).pop("on_train_batch_end", None)  # the module's own hook again
        if not isinstance(exception, OSError):  # after a failed write, do not try another
            self._write_staged(trainer)  # a state saved before the failing step is still a good one
        try:
            self._wait_for_write()
        except CheckpointWriteError as error:
            print(f"also: {error}", file=sys.stderr)
        finally:
            self._shut_down()
        stopped = isinstance(exception, SystemExit) and exception.code == self._exit_code is not None
        if stopped and trainer.is_global_zero:  # the run's last line (Lightning calls Checkpoints' hooks last)
            name = signal.Signals(self._exit_code - 128).name if self._exit_code > 128 else "a signal"
            print(f"stopped by {name}: {self.shown or self.path} holds step {self._saved_at}", file=sys.stderr)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        vars(pl_module).pop("on_train_batch_end", None)  # the module's own hook again
        try:
            self._wait_for_write()
        finally:
            owned_signals = self._owns_signals
            self._shut_down()
        if owned_signals and STOP_SIGNALS.exit_code is not None:  # a signal after the final state was saved
            raise SystemExit(STOP_SIGNALS.exit_code)

    def _is_due(self, step: int, epoch_end: bool) -> bool:
        """Whether the step count has reached a multiple of `every_n_steps` since the last write."""
        if self.every_n_steps == 0:
            return epoch_end
        return step // self.every_n_steps > self._saved_at // self.every_n_steps

    @staticmethod
    def _training_ends(trainer: L.Trainer) -> bool:
        """Whether this step or this epoch end is the last of the run (max_steps or max_epochs reached)."""
        loop = trainer.fit_loop
        steps_done = loop.max_steps not in (None, -1) and trainer.global_step >= loop.max_steps
        epochs_done = loop.max_epochs not in (None, -1) and loop.epoch_progress.current.processed >= loop.max_epochs
        return steps_done or epochs_done

    def _stopping(self, trainer: L.Trainer) -> bool:
        """Whether to stop now: a signal reached a rank, or a write failed. Every rank must agree, or the ranks would
        stop at different steps. A failed write raises here, on every rank."""
        lost = self._io.failure()  # (a run directory in object storage whose store failed for good)
        write_failed = self._write is not None and self._write.done() and self._write.exception() is not None
        failed = lost is not None or write_failed
        stop = STOP_SIGNALS.received is not None or failed
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
            if stop and trainer.strategy.reduce_boolean_decision(failed, all=False) and not failed:
                raise SystemExit(f"rank {trainer.global_rank}: stopping, rank 0 could not write {self.path}")
        if lost is not None:
            raise lost
        if failed:
            self._wait_for_write()  # raises the write's error
        return stop

    def _stage(self, trainer: L.Trainer) -> None:
        """Take the trainer's full state now (every rank must call this); `_write_staged` writes it."""
        if trainer.fast_dev_run or trainer.sanity_checking:
            return  # a smoke run must not replace a real run's checkpoint
        self._wait_for_write()  # one write at a time, so snapshots cannot pile up in memory
        checkpoint = dump_checkpoint(trainer)  # on every rank
        if not self._writes_in_background(trainer):
            self._staged = (checkpoint, None)
        elif self._writer is not None:  # rank 0
            self._staged = snapshot(checkpoint)
        trainer.strategy.barrier("last_checkpoint")
        self._saved_at = self._staged_here = checkpoint[STEPS]

    @staticmethod
    def _writes_in_background(trainer: L.Trainer) -> bool:
        """Whether rank 0 writes the checkpoint alone (one device, DDP); FSDP and DeepSpeed write their own way, with
        every rank taking part, so in the training thread."""
        return type(trainer.strategy).save_checkpoint is Strategy.save_checkpoint

    def _write_staged(self, trainer: L.Trainer) -> None:
        """Write the staged state to last.ckpt: called at the hook after `_stage`, once that step's metrics are
        logged, and flushed to disk first (a resumed run drops what was logged from the checkpoint's step on and
        logs it again, so every step before it must be on disk before the checkpoint is)."""
        if self._staged is None:
            return
        state, copied = self._staged
        self._staged = None
        for logger in trainer.loggers:
            logger.save()
        self._io.logs_flushed()
        if self._writes_in_background(trainer):
            self._write = self._writer.submit(self._write_in_background, state, copied)
        else:
            trainer.strategy.save_checkpoint(state, self.path)

    def _write_in_background(self, state: dict, copied: torch.cuda.Event | None) -> None:
        if copied is not None:
            copied.synchronize()
        self._io.save_checkpoint(state, self.path)

    def _write_staged_then_exit_if_stopping(self, trainer: L.Trainer) -> None:
        self._write_staged(trainer)
        if self._exit_code is not None:
            self._wait_for_write()
            raise SystemExit(self._exit_code)  # (said by on_exception, once the progress bars are closed)

    def _wait_for_write(self) -> None:
        """Block until the background write is done; raise its error (a CheckpointWriteError) here."""
        write, self._write = self._write, None
        if write is not None:
            write.result()

    def _shut_down(self) -> None:
        if self._writer is not None:
            self._writer.shutdown()
            self._writer = None
        if self._owns_signals:
            STOP_SIGNALS.uninstall()
            self._owns_signals = False
