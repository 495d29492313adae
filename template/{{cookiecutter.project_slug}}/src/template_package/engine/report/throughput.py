"""Samples/s, the share of time the loop waits for data, and on a GPU the model FLOPs utilisation. (Lightning's
ThroughputMonitor counts samples/s and FLOPs but does not separate the wait for data, which is what tells a slow loader
apart.) Depends on torch, lightning and flops.py."""

import contextlib
import dataclasses
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.utilities.data import extract_batch_size

from ..training.steps import logged_step, logs_this_step
from .flops import peak_flops


class Throughput(Callback):
    """Logs `perf/samples_per_sec` and `perf/data_wait_share` on the steps the logger writes, and
    `perf/epoch_seconds` at every epoch end. On a GPU whose peak is known (flops.py) it also logs `perf/mfu`, the
    model FLOPs utilisation: samples/s x the model's training FLOPs per sample (its `flops_per_sample()`,
    counted once) / the GPU's dense peak FLOP/s at the run's precision.

    They go straight to the loggers, as with Lightning's own LearningRateMonitor and ThroughputMonitor: through
    `self.log` each value would cost a Python round through Lightning's result collection every step. So they are not in
    `trainer.callback_metrics` and cannot be monitored; `latest` holds the values last written.

    The data wait is the time the training loop spends fetching its next batch: Lightning brackets each fetch with
    `trainer.profiler.start/stop("[_TrainingEpochLoop].train_dataloader_next")`, which this callback times through a
    thin wrapper around the trainer's profiler (whatever profiler is configured keeps working). Its share of the wall
    time between batch starts says whether the loader keeps up; above a few percent, add workers.
    """

    FETCH = "train_dataloader_next"

    def __init__(self) -> None:
        self._reset()
        self._epoch_started: float | None = None  # None in a run resumed mid-epoch: its epoch time is not whole
        self.latest: dict[str, float] = {}  # the values last written
        self._peak: float | None = None  # FLOP/s of the device: set on a GPU whose peak is known
        self._flops_per_sample: int | None = None

    def _reset(self) -> None:
        self._last_start = None  # the gap across an epoch boundary or validation is not a step
        self._samples, self._seconds, self._waiting = 0, 0.0, 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and not isinstance(trainer.profiler, _FetchTimer):
            trainer.profiler = _FetchTimer(trainer.profiler, self.FETCH, self._on_fetch)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if isinstance(trainer.profiler, _FetchTimer):
            trainer.profiler = trainer.profiler.profiler

    def _on_fetch(self, seconds: float) -> None:
        self._waiting += seconds

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if callable(getattr(pl_module, "flops_per_sample", None)):
            self._peak = peak_flops(pl_module.device, str(trainer.precision))

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset()  # (a run resumed mid-epoch starts without this hook: __init__ has reset it)
        self._epoch_started = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._epoch_started is not None:  # the wall time of the epoch, its validation included
            seconds = time.perf_counter() - self._epoch_started
            write_to_loggers(trainer, {"perf/epoch_seconds": seconds})

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_start is None:
            self._waiting = 0.0  # fetches before the first timed interval (the loop prefetches one batch)
        else:
            self._seconds += now - self._last_start
            self._samples += self._batch_size
        self._last_start, self._batch_size = now, samples_in(batch)
        if self._peak is not None and self._flops_per_sample is None:
            self._flops_per_sample = pl_module.flops_per_sample()
            self._peak = self._peak if self._flops_per_sample else None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self._seconds > 0 and logs_this_step(trainer):
            self.latest = {"perf/samples_per_sec": self._samples / self._seconds}
            self.latest["perf/data_wait_share"] = self._waiting / self._seconds
            if self._flops_per_sample is not None:
                self.latest["perf/mfu"] = self.latest["perf/samples_per_sec"] * self._flops_per_sample / self._peak
            write_to_loggers(trainer, self.latest)
            self._samples, self._seconds, self._waiting = 0, 0.0, 0.0


def samples_in(batch) -> int:
    """The number of samples in a batch of any structure: the first dimension of its first tensor, found in tuples,
    lists, dicts and dataclasses (Lightning's own extract_batch_size, which also looks into objects' attributes here);
    1 for a batch without a tensor. (A tensor, or a tuple or list that starts with one, is read directly: the most
    common batches, at every step.)"""
    first = batch[0] if isinstance(batch, tuple | list) and batch else batch
    if isinstance(first, torch.Tensor) and first.ndim > 0:
        return first.shape[0]
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        batch = {field.name: getattr(batch, field.name) for field in dataclasses.fields(batch)}
    elif not isinstance(batch, torch.Tensor | list | tuple | dict) and hasattr(batch, "__dict__"):
        batch = vars(batch)
    try:
        return extract_batch_size(batch)
    except Exception:  # noqa: BLE001 - Lightning raises a MisconfigurationException, which is no mistake here
        return 1


def write_to_loggers(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    """Straight to every logger, at the step of the current (at an epoch end: the last) training batch, on Lightning's
    own x-axis (training/steps.py), without the flush that Lightning's own path makes after each write (a flush per
    logged step is a cost of every step; LastCheckpoint flushes the loggers before each checkpoint,
    which is when it matters)."""
    step = logged_step(trainer)
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


class _FetchTimer:
    """Stands in for `trainer.profiler`: forwards every call to it, and reports how long each `action` took."""

    _NOTHING = contextlib.nullcontext()

    def __init__(self, profiler, action: str, report) -> None:
        self.profiler, self._action, self._report, self._started = profiler, action, report, 0.0
        self._passes_through = type(profiler) is PassThroughProfiler

    def start(self, action_name: str) -> None:
        if action_name.endswith(self._action):
            self._started = time.perf_counter()
        self.profiler.start(action_name)

    def stop(self, action_name: str) -> None:
        self.profiler.stop(action_name)
        if action_name.endswith(self._action):
            self._report(time.perf_counter() - self._started)

    def profile(self, action_name: str):
        """What Lightning wraps every hook call in, about 100 times a step. Without a profiler configured, Lightning's
        PassThroughProfiler gives a generator-based context manager; this one returns a ready null context."""
        return self._NOTHING if self._passes_through else self.profiler.profile(action_name)

    def __getattr__(self, name: str):
        return getattr(self.profiler, name)
