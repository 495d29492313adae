"""The metric a run optimises, named in one place: `checkpoint.monitor` and `checkpoint.mode` (configs/default.yaml).

- `BestCheckpoints`: Lightning's ModelCheckpoint, whose file names follow the monitored metric
  (`epoch=3-val_loss=1.2345.ckpt`) and which stops a run at its first validation (the sanity check's, before any
  training) when the model does not log that metric (Lightning's own stops only after the first epoch); without a
  metric to monitor, last.ckpt only.
- `EarlyStopping`: Lightning's, which under the CLI follows checkpoint.monitor and checkpoint.mode unless given its own,
  and says when it stopped a run.
The sweep's metric and direction follow them too (sweep/search.py).
Depends on lightning and the engine's errors.py.
"""

import sys

import lightning as L
from lightning.pytorch.callbacks import EarlyStopping as LightningEarlyStopping
from lightning.pytorch.callbacks import ModelCheckpoint

from ..errors import UsageError


def metric_filename(monitor: str) -> str:
    """`epoch={epoch}-val_loss={val/loss:.4f}` for val/loss: the epoch and the monitored value in every file name."""
    return "epoch={epoch}-" + monitor.replace("/", "_") + "={" + monitor + ":.4f}"  # (a format for Lightning)


class BestCheckpoints(ModelCheckpoint):
    """Lightning's ModelCheckpoint; `filename` left out names each file by its epoch and monitored value.

    It checks the monitored metric at the first validation (the sanity check's, or else the first of training): a
    module that does not log it stops there with one line naming what it does log, before any training is lost
    (Lightning's own check comes only at the first checkpoint, after a whole epoch). `monitor=None` keeps no best
    checkpoints, only last.ckpt (resume/exact_resume.py), and says so once.

    Args:
        filename: a ModelCheckpoint file name pattern; None: `metric_filename(monitor)`.
        **kwargs: ModelCheckpoint's own (monitor, mode, save_top_k, ...).
    """

    # The name of a last file it would write with save_last, which ExactResume refuses: its folder's last.ckpt is
    # ExactResume's, which Lightning's look-up of a fit's last checkpoint must not take for one of this callback's.
    CHECKPOINT_NAME_LAST = "last-of-best"

    def __init__(self, filename: str | None = None, **kwargs) -> None:
        monitor = kwargs.get("monitor")
        if filename is None and monitor:
            filename, kwargs["auto_insert_metric_name"] = metric_filename(monitor), False
        if not monitor:
            kwargs["save_top_k"] = 0  # (Lightning refuses a top-k without a metric to rank by)
        self._state_key: str | None = None
        steps, interval = kwargs.get("every_n_train_steps"), kwargs.get("train_time_interval")
        self.saves_at_batches = bool(steps) or interval is not None  # (else only at epoch or validation ends)
        super().__init__(filename=filename, **kwargs)
        self._checked = False
        self._before_validation: set[str] = set()

    # (local folder, URL) of a run directory in object storage, set by the CLI: its checkpoints save their files'
    # paths under the URL, which a run resumed on another machine reads back into its own local folder.
    moved: tuple[str, str] | None = None

    @property
    def state_key(self) -> str:
        """ModelCheckpoint's key, a repr of the settings it was made with, made once: Lightning reads it at every hook
        call, several times a step."""
        if self._state_key is None:
            self._state_key = super().state_key
        return self._state_key

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        """Lightning's save check at each training batch, made only where a batch can save (every_n_train_steps or
        train_time_interval): elsewhere it is work at every step for nothing."""
        if self.saves_at_batches:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def state_dict(self) -> dict:
        state = super().state_dict()
        return state if self.moved is None else with_paths_moved(state, *self.moved)

    def load_state_dict(self, state_dict: dict) -> None:
        if self.moved is not None:
            state_dict = with_paths_moved(state_dict, self.moved[1], self.moved[0])
        super().load_state_dict(state_dict)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit" and not self.monitor and trainer.is_global_zero:
            print("notice: checkpoint.monitor is null: no best checkpoints, only last.ckpt", file=sys.stderr)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._before_validation = set(trainer.callback_metrics)

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_monitored(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_monitored(trainer, pl_module)
        super().on_validation_end(trainer, pl_module)

    def _check_monitored(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """(A run without validation is not checked: Lightning warns at each epoch end that nothing is monitored.)"""
        if self._checked or not self.monitor or trainer.state.fn != "fit":
            return
        self._checked = True
        if self.monitor in trainer.callback_metrics:
            return
        logged = set(trainer.callback_metrics) - {"epoch", "step"} - self._before_validation
        what = f"which logs {', '.join(sorted(logged))} in validation" if logged else "which logs nothing in validation"
        raise UsageError(
            f"checkpoint.monitor={self.monitor!r} is not logged by {type(pl_module).__name__}, {what}: set "
            "--checkpoint.monitor to a metric it logs with self.log (and --checkpoint.mode min or max), in "
            "configs/default.yaml for good, or null for last.ckpt only"
        )


def with_paths_moved(state: dict, old: str, new: str) -> dict:
    """A ModelCheckpoint's state with each path under `old` put under `new` (best_k_models' keys too)."""

    def moved(value):
        if isinstance(value, str) and (value == old or value.startswith(old + "/")):
            return new + value[len(old) :]
        if isinstance(value, dict):
            return {moved(key): moved(item) for key, item in value.items()}
        return value

    return moved(state)


class EarlyStopping(LightningEarlyStopping):
    """Lightning's EarlyStopping. Under the CLI, `monitor` and `mode` left out are checkpoint.monitor and
    checkpoint.mode (the CLI fills them in before it builds the callback).

    Args:
        monitor: the metric to watch; None: checkpoint.monitor.
        mode: "min" or "max"; None: checkpoint.mode.
        **kwargs: EarlyStopping's own (patience, min_delta, ...).
    """

    def __init__(self, monitor: str | None = None, mode: str | None = None, **kwargs) -> None:
        if monitor is None or mode is None:
            raise UsageError("EarlyStopping needs monitor and mode (the CLI takes them from checkpoint.monitor/mode)")
        super().__init__(monitor=monitor, mode=mode, **kwargs)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Say that the run stopped early, and why: Lightning says so only in its log at info level, which a run does
        not show, so an early stop read like a run that went its whole length."""
        if self.stopping_reason_message and trainer.is_global_zero:  # (set when this callback stopped the run)
            print(
                f"notice: stopped early at epoch {self.stopped_epoch}: {self.stopping_reason_message}", file=sys.stderr
            )


def follow_the_monitored_metric(config) -> None:
    """Give every engine EarlyStopping of a parsed config the checkpoint's monitor and mode where it has none."""
    for callback in config.trainer.callbacks or []:
        class_path = getattr(callback, "class_path", "")
        if class_path.rsplit(".", 1)[-1] == "EarlyStopping" and class_path.startswith(__package__):
            arguments = callback.init_args
            arguments.monitor = arguments.monitor or config.checkpoint.monitor
            arguments.mode = arguments.mode or config.checkpoint.mode
