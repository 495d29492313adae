"""Exact resume, as one Lightning callback: `ExactResume(dirpath=None, every_n_steps=1000)` in any Trainer's callbacks
(a script's own `lightning.Trainer`, a Hydra `_target_`, a LightningCLI of your own, the engine's Trainer) keeps
`dirpath/last.ckpt` (default `<default_root_dir>/checkpoints`), and `trainer.fit(model, data, ckpt_path="last")` goes
on from it to the bits and logged values of the run that never stopped. It is what the engine's Trainer and CLI use
for resume, and all they use.

What is in last.ckpt, who writes each part and who puts it back:

| key | written by | put back |
| --- | --- | --- |
| state_dict, optimizer_states, lr_schedulers, epoch, global_step | Lightning | Lightning, loading it |
| loops: progress, the train loader's position | Lightning | Lightning; finished epochs stay so (finished_epochs.py) |
| callbacks: each callback's state_dict | Lightning | each callback; checked before the first step (trained_state.py) |
| hyper_parameters, datamodule_hyper_parameters | Lightning, stored plain (loadable.py) | (the config builds them) |
| training_steps | ExactResume (training/steps.py) | where a resumed run logs on; when the next write is due |
| rng_states | rng.py RandomStates, every rank's | the same, when training starts |
| trained_state | trained_state.py TrainedState | put back or checked when training starts |
| train_loader_seed, batch_layout, no_batch_layout, drawn_order | data/loaders.py ResumableLoaders | the same |
| epoch_state | epoch_state.py EpochState, every rank's | after the module's on_train_start; sums after a batch |
| recipe_log_window | training/recipe.py TrainingRecipe (its own hook) | the same |
| taken_at | ExactResume: the time the state was taken (its digest says it too) | what a resumed run removes |

Beside it: `last.ckpt.crc32`, its digest (digests.py), and `previous.ckpt` with its own, the last.ckpt before it, kept
(a hard link: no copy) until the new one is written whole and durable. A resume whose last.ckpt fails its digest, or
is missing, goes on from previous.ckpt with a notice, and stops in one line when that fails too, changing nothing
(`resolve_last`). previous.ckpt is not named `last*`: Lightning's own look-up of a last checkpoint would take it.
`keep_previous=False` keeps last.ckpt alone, for a state that does not fit twice on the disk.

When last.ckpt is written: after an optimizer step whose count (training/steps.py) reaches a multiple of
`every_n_steps` (never inside a gradient-accumulation window; one due on an epoch's last batch at that epoch's end,
after its validation and every epoch-end hook), at every epoch's end with `every_n_steps=0`, when training ends
however it ended, and at a stop signal: SIGTERM, SIGUSR1 and Ctrl-C finish the current optimizer step (or validation
batch: validation.py), write it and exit with 143, 138 or 130 (stop_signals.py). The state is copied in the training
thread and written in the background, durably (durable.py), once every step before it is logged.

A fit holds its run's lock (`.lock` beside `dirpath`, in the run directory: run_lock.py) from its start;
`fit(ckpt_path="last")` resumes the folder's last.ckpt or, when it has none yet, trains from scratch with a notice; a
fit without `ckpt_path` into a folder that holds a run is refused in one line. Before its first save, a fit removes
what a stopped run left in the run directory after the state the fit starts from (leftovers.py). What needs a parsed
command line stays with the CLI: the comparison of changed options, a run directory in object storage, purging what
the killed run logged after its checkpoint.
Depends on torch, lightning and the engine's resume/, data/loaders.py and training/steps.py.
"""

import errno
import signal
import sys
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning.pytorch.strategies import Strategy
from torch.multiprocessing import ProcessExitedException

from ..data.loaders import ResumableLoaders
from ..errors import UsageError
from ..internals import ckpt_path_being_resolved
from ..training.steps import KEY as STEPS
from ..training.steps import steps_in, training_steps
from .digests import TAKEN_AT, damage
from .durable import CheckpointWriteError, DurableCheckpointIO, snapshot
from .epoch_state import EpochState
from .finished_epochs import keep_finished_epochs_finished
from .leftovers import remove_temporaries, remove_unknown
from .loadable import check_hyperparameters, check_loadable, store_plain
from .remote_run import is_url, redacted
from .run_lock import RunDirectoryBusy, RunLock, is_global_rank_zero
from .stop_signals import SIGNALS, STOP_SIGNALS, exit_code
from .trained_state import TrainedState
from .validation import dump_checkpoint
from .whole_checkpoint import META, is_checkpoint, saved_step

PREVIOUS = "previous.ckpt"  # the last.ckpt before the newest, beside it

# Lightning's warnings about an OnExceptionCheckpoint's file, which ExactResume says in its own words.
for _message in (r"`\.fit\(ckpt_path=None\)` was called without a model", r'\.fit\(ckpt_path="last"\) is set, but'):
    warnings.filterwarnings("ignore", message=_message)


def resolve_last(
    last: Path, asked, smoke: bool, option: str, elsewhere: str, say: bool = True, shown=str, run: Path | None = None
) -> Path | None:
    """The checkpoint a fit asked for with `asked` resumes: "last" is `last`, or the previous state beside it when
    `last` fails its digest or is missing (`intact_state`), else None, said (where `say`); None is None, and a fit
    without a checkpoint over a run (its folder `run`, last's by default; a smoke run, which writes nothing, may) is
    refused. `option` and `elsewhere` say how to ask for the run and for another folder."""
    previous = last.with_name(PREVIOUS)
    held = [path for path in (last, previous) if is_checkpoint(path)]
    if asked == "last":
        if held:
            return intact_state(last, previous, option, elsewhere, say, shown)
        if say:
            print(f"{option}: no {shown(last)} yet, starting a fresh run")
        return None
    if held and not smoke:
        raise UsageError(
            f"{shown(run or last.parent)} already holds a run ({shown(held[0])}): resume it with {option}, or give "
            f"{elsewhere}"
        )
    return None


def intact_state(last: Path, previous: Path, option: str, elsewhere: str, say: bool, shown=str) -> Path:
    """`last` when it matches its digest; else `previous` when that does, said in one notice naming both and their
    steps; else a UsageError in one line, and nothing is changed."""
    why = _damage(last)
    if why is None:
        return last
    why_not = _damage(previous)
    if why_not is not None:
        raise UsageError(
            f"{shown(last)} {why}, and {shown(previous)} {why_not}: nothing to resume from; resume from a best "
            f"checkpoint beside them with {option.replace('last', 'FILE')}, or give {elsewhere}"
        )
    if say:
        print(f"notice: {shown(last)} {why}: resuming from {shown(previous)}, the state before it ({_step(previous)})",
              file=sys.stderr)  # fmt: skip
    return previous


def _damage(path: Path) -> str | None:
    """What is wrong with the checkpoint `path`, as the end of a sentence naming it; None when it is intact."""
    if not is_checkpoint(path):
        return "is missing"
    why = damage(path / META if path.is_dir() else path)
    return None if why is None else f"({_step(path)}) is damaged: {why}"


def _step(path: Path) -> str:
    try:
        return f"step {saved_step(path)}"
    except Exception:  # noqa: BLE001 - a damaged file may fail in any way; the notice says so
        return "its step cannot be read"


class ExactResume(OnExceptionCheckpoint):
    """Every resume guarantee of the engine in one callback (see the module docstring).

    Args:
        dirpath: folder of `last.ckpt`; None: `<default_root_dir>/checkpoints`. The folder above it is the run's,
            which one fit at a time holds (its `.lock`).
        every_n_steps: write last.ckpt whenever the training step count (training/steps.py: optimizer steps under
            automatic optimization, batches under manual optimization, the x-axis of the logs) reaches a multiple of
            this (0: at every epoch end instead). The default, 1000, bounds the loss on a crash, not on preemption (a
            stop signal saves the current step). Each write copies the whole state: keep writes far enough apart that
            they cost little beside training.
        keep_previous: keep the last.ckpt before the newest as previous.ckpt, which a resume goes on from when
            last.ckpt is damaged. The disk then holds two states, three while one is written; False: one, two.

    A write that fails (a full disk, say) stops the run at the next optimizer step with `durable.CheckpointWriteError`;
    last.ckpt keeps the previous state, byte for byte. `allowed` (the CLI's `--allow_change`) lets options and
    callbacks' states differ on a resume; `world_size_may_change` lets a run go on on another number of processes;
    `locks=False` takes no lock (the CLI's `--run_lock off`).
    """

    FILENAME = "last.ckpt"
    PREVIOUS = PREVIOUS
    writes = True  # False: the run stays exact and writes no checkpoint (the engine's enable_checkpointing=False)
    best_model_path = ""  # (it keeps no best checkpoint: Lightning's ckpt_path="best" then asks for a ModelCheckpoint)
    shown: str | None = None  # how its file is named in what it prints: a run in object storage's URL (set by the CLI)

    def __init__(
        self, dirpath: str | Path | None = None, every_n_steps: int = 1000, keep_previous: bool = True
    ) -> None:
        if every_n_steps < 0:
            raise UsageError(f"every_n_steps={every_n_steps} must be >= 0 (0 writes at every epoch end)")
        if dirpath is not None and is_url(str(dirpath)):
            raise UsageError(
                f"ExactResume(dirpath={redacted(str(dirpath))!r}) is a URL: give it a local folder (the CLI keeps a "
                "run directory in object storage through a local one, resume/remote_run.py)"
            )
        super().__init__(dirpath, "last")
        self.dirpath = None if dirpath is None else Path(dirpath)
        self.every_n_steps, self.keep_previous = every_n_steps, keep_previous
        self.trained, self.loaders, self.epoch = TrainedState(), ResumableLoaders(), EpochState()
        self.locks = True
        self._lock: RunLock | None = None
        self._saved_at = -1  # the training steps of the state last staged, or of the checkpoint resumed
        self._staged_here: int | None = None  # the training steps of the state this process staged last
        self._staged: tuple[dict, torch.cuda.Event | None] | None = None  # a state waiting to be written
        self._first_write = True  # (checked to load back with weights_only before it is written)
        self._io = DurableCheckpointIO()
        self._writer: ThreadPoolExecutor | None = None  # rank 0's writes, one at a time
        self._write: Future | None = None
        self._step_at_batch_start = -1
        self._exit_code: int | None = None
        self._owns_signals = False
        self._resumed = False  # whether the metrics and sums of a resumed run are to be put back
        self._taken_at: float | None = None  # when the state this fit goes on from was taken (None: a fresh start)
        self._last_is_good = False  # whether last.ckpt is this fit's own or the one it resumed: kept at a save

    @property
    def allowed(self) -> list[str]:
        return self.trained.allowed

    @allowed.setter
    def allowed(self, options: list[str]) -> None:
        self.trained.allowed = options

    @property
    def world_size_may_change(self) -> bool:
        return self.loaders.world_size_may_change

    @world_size_may_change.setter
    def world_size_may_change(self, may: bool) -> None:
        self.loaders.world_size_may_change = may

    @property
    def path(self) -> Path:
        return self.dirpath / self.FILENAME

    @property
    def previous_path(self) -> Path:
        return self.dirpath / self.PREVIOUS

    @property
    def ckpt_path(self) -> str | None:
        """What Lightning resumes for `fit(ckpt_path="last")`, and, as ExactResume is an OnExceptionCheckpoint, for a
        `fit()` without ckpt_path too: last.ckpt for the first, nothing (or a refusal over a run) for the second."""
        resolving = ckpt_path_being_resolved()
        if resolving is None:  # (read by anything else than Lightning's resolution of a fit's ckpt_path)
            return None if self.dirpath is None else str(self.path)
        trainer, asked = resolving
        self._default_dirpath(trainer)
        # (The ranks of ddp_spawn's processes are set up later: until then each says it is rank 0, as its launcher's
        # environment does not.)
        first = trainer.is_global_zero and is_global_rank_zero()
        self._hold_the_run(first)
        elsewhere = "the Trainer another default_root_dir, or ExactResume another dirpath"
        last = resolve_last(self.path, asked, bool(trainer.fast_dev_run), 'fit(ckpt_path="last")', elsewhere, first)
        return None if last is None else str(last)

    def _default_dirpath(self, trainer: L.Trainer) -> None:
        """The folder of last.ckpt, when none was given: `<default_root_dir>/checkpoints`."""
        self.dirpath = self.dirpath or Path(trainer.default_root_dir) / "checkpoints"

    def _hold_the_run(self, first: bool) -> None:
        """Take the run's lock in its first process (the CLI may hold it already: then it is shared)."""
        if self._lock is not None or not self.locks or not first:
            return
        lock = RunLock(self.dirpath.parent, shared=True)  # (the run's folder: <run dir>/checkpoints's)
        try:
            lock.acquire()
        except RunDirectoryBusy as busy:
            raise UsageError(
                f"{self.dirpath.parent} is being trained by another fit ({busy.holder}): let it finish or stop it, or "
                "give another folder"
            ) from None
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise UsageError(f"cannot write {self.dirpath} ({error.strerror}): give another folder") from None
            print(f"warning: cannot lock {self.dirpath} ({error.strerror}): make sure no other fit uses it",
                  file=sys.stderr)  # fmt: skip
            return
        self._lock = lock

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._default_dirpath(trainer)
        for callback in trainer.callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.save_last:
                raise UsageError(
                    f"{type(callback).__name__}(save_last={callback.save_last!r}) writes a last.ckpt of its own beside "
                    f"ExactResume's {self.path}, which a resume could take for it: set its save_last to False"
                )
        checkpoint_io = trainer.strategy.checkpoint_io
        if isinstance(checkpoint_io, AsyncCheckpointIO):
            raise UsageError(
                "trainer.plugins: AsyncCheckpointIO returns before a checkpoint is written, so last.ckpt could be "
                "renamed into place half-written; leave it out (last.ckpt is already written in the background)"
            )
        if isinstance(checkpoint_io, DurableCheckpointIO):
            self._io = checkpoint_io
        check_hyperparameters([pl_module, trainer.datamodule])
        keep_finished_epochs_finished(trainer)  # (its epoch-end states resume exactly with max_steps set too)
        # Lightning's "best" reads the first Checkpoint in the list: the callbacks that keep best checkpoints first. (A
        # new list: Lightning is calling the setup hooks of this one.)
        trainer.callbacks = sorted(trainer.callbacks, key=lambda callback: callback is self)
        if not STOP_SIGNALS.installed:  # the CLI installs them at start-up; a plain Trainer gets them here
            STOP_SIGNALS.install()
            self._owns_signals = True
        self._hold_the_run(trainer.is_global_zero)
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
            remove_temporaries(self.dirpath)  # (the files whose writes were killed are intact)
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="last-checkpoint")
        self.loaders.setup(trainer, pl_module)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """Every checkpoint of the run (the best ones too) gets what a resume needs beyond Lightning's own."""
        checkpoint[STEPS] = training_steps(trainer)  # where a run resumed from it logs on (cli/run_directory.py)
        checkpoint[TAKEN_AT] = time.time()
        self.trained.save(trainer, pl_module, checkpoint)
        self.loaders.save(trainer, checkpoint)
        self.epoch.save(trainer, pl_module, checkpoint)
        store_plain(checkpoint)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._saved_at = steps_in(checkpoint)  # writing this state again would be a write mid-window
        resumed = Path(trainer.ckpt_path)
        self._last_is_good = resumed.resolve() == self.path.resolve()
        self._taken_at = checkpoint.get(TAKEN_AT, float("inf"))  # (an earlier release's: nothing is after it)
        # No sanity check in a resumed run: the run's start made it, and Lightning skips it mid-epoch itself, but at an
        # epoch boundary it would run the module's validation hooks once more than the run that never stopped did.
        trainer.num_sanity_val_steps = 0
        self.trained.load(trainer, checkpoint)
        self.loaders.load(trainer, checkpoint)  # (after: it rewrites the loops' batch counts of a moved run)
        self.epoch.load(trainer, checkpoint)
        self._resumed = True

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        STOP_SIGNALS.install()  # take the signals back from the handler Lightning has just installed

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.trained.train_starts(trainer, pl_module)
        self._remove_what_a_stopped_run_wrote(trainer)
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

    def _before_the_first_step(self, pl_module: L.LightningModule) -> None:
        """After the module's on_train_start (which may reset its metrics, as the run that never stopped did at its
        own start): the metrics of the epoch as the checkpoint holds them."""
        if self._resumed:
            self._resumed = False
            self.epoch.before_the_first_step(pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._before_the_first_step(pl_module)
        self.trained.epoch_starts()
        self._write_staged_then_exit_if_stopping(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._before_the_first_step(pl_module)
        self.trained.batch_starts(pl_module)
        self._write_staged_then_exit_if_stopping(trainer)
        self._step_at_batch_start = trainer.global_step

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss) -> None:
        self.trained.before_backward(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:  # (a run resumed in a validation after an epoch's last batch starts here)
            self._before_the_first_step(pl_module)
        self._write_staged_then_exit_if_stopping(trainer)
        self.trained.random.validation_starts(trainer, pl_module)
        self.epoch.validation_starts(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.trained.random.validation_ended(pl_module)
        self.epoch.validation_ended()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        """A signal during a validation of training stops it within a batch: the state saved is the training state
        as validation found it (validation.py), and the resumed run does the validation again."""
        if trainer.sanity_checking or not STOP_SIGNALS.deferred or not self._stopping(trainer):
            return
        self._stage(trainer)
        self._exit_code = STOP_SIGNALS.exit_code or exit_code(signal.SIGTERM)  # (another rank's signal)
        self._write_staged_then_exit_if_stopping(trainer)

    def after_the_batch(self, trainer: L.Trainer) -> None:
        """After a training batch's hooks, the module's own included (see on_train_start)."""
        self.epoch.after_the_batch(trainer)
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
            self._exit_code = STOP_SIGNALS.exit_code or exit_code(signal.SIGTERM)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After the module's own epoch-end hook and every other callback's (a Checkpoint's place). The state staged
        here is written at the next hook, once Lightning has logged the epoch's metrics; a signal during the epoch's
        last batch or its validation stops there, unless training ends anyway: then on_train_end writes the final
        state, and the process exits with the signal's code after it."""
        self._before_the_first_step(pl_module)
        self.epoch.epoch_ends(trainer)
        self._write_staged_then_exit_if_stopping(trainer)
        if self._training_ends(trainer):
            return  # (the last epoch's state is written by on_train_end, with the epoch counted as done)
        if self._stopping(trainer):
            self._stage(trainer)
            self._exit_code = STOP_SIGNALS.exit_code or exit_code(signal.SIGTERM)
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
        if isinstance(exception, ProcessExitedException) and exception.exit_code in map(exit_code, SIGNALS):
            # (ddp_spawn's launching process: the stopped processes' line and code)
            self._default_dirpath(trainer)
            self._say_stopped(exception.exit_code, _step(self.path))
            raise SystemExit(exception.exit_code)
        if isinstance(exception, KeyboardInterrupt) and self._writer is None:  # (before training, or that process)
            raise SystemExit(exit_code(signal.SIGINT))
        vars(pl_module).pop("on_train_batch_end", None)  # the module's own hook again
        self.loaders.teardown(trainer, pl_module)
        if not isinstance(exception, OSError | UsageError):  # after a failed write, do not try another
            self._write_staged(trainer)  # a state saved before the failing step is still a good one
        try:
            self._wait_for_write()
        except CheckpointWriteError as error:
            print(f"also: {error}", file=sys.stderr)
        finally:
            self._shut_down()
        stopped = isinstance(exception, SystemExit) and exception.code == self._exit_code is not None
        if stopped and trainer.is_global_zero:  # the run's last line (Lightning calls Checkpoints' hooks last)
            self._say_stopped(self._exit_code, f"step {self._saved_at}")

    def _say_stopped(self, code: int, step: str) -> None:
        name = signal.Signals(code - 128).name if code > 128 else "a signal"
        print(f"stopped by {name}: {self.shown or self.path} holds {step}", file=sys.stderr)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.loaders.teardown(trainer, pl_module)
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
        if trainer.fast_dev_run or trainer.sanity_checking or not self.writes:
            return  # a smoke run must not replace a real run's checkpoint
        self._wait_for_write()  # one write at a time, so snapshots cannot pile up in memory
        checkpoint = dump_checkpoint(trainer)  # on every rank
        if self._first_write:
            check_loadable(checkpoint, self.shown or self.path)
        self._first_write = False
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
        """last.ckpt, the one it replaces kept as previous.ckpt when it is this fit's own or the one it resumed (one
        that the fit went on without, damaged, must not replace a good previous.ckpt)."""
        if copied is not None:
            copied.synchronize()
        keep = self.keep_previous and self._last_is_good
        self._io.save_checkpoint(state, self.path, storage_options={"previous": self.previous_path} if keep else None)
        self._last_is_good = True
        if not self.keep_previous and self.previous_path.exists():
            self._io.remove_checkpoint(self.previous_path)

    def _remove_what_a_stopped_run_wrote(self, trainer: L.Trainer) -> None:
        """The best checkpoints a stopped run wrote after the state this fit starts from (leftovers.py)."""
        if not trainer.is_global_zero or not self.writes or trainer.fast_dev_run:
            return
        when = f"after step {self._saved_at}, where this fit goes on" if self._taken_at else "before any last.ckpt"
        kept = [self.path, self.previous_path]
        for folder, names in remove_unknown(trainer, self._io, self.dirpath.parent, kept, self._taken_at).items():
            shown = self.shown.rsplit("/", 1)[0] if self.shown else folder  # (a run in object storage: its URL)
            print(f"notice: removed {', '.join(names)} from {shown}: written by a stopped run {when}, and unknown to "
                  "it", file=sys.stderr)  # fmt: skip

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
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __getstate__(self) -> dict:
        """What a spawned process (`strategy="ddp_spawn"`) gets: the settings, none of this process's threads or
        locks."""
        return {**vars(self), "_writer": None, "_write": None, "_lock": None, "_staged": None}
