"""Callbacks that report on a run: predictions to CSV, a confusion-matrix image, throughput. None of them assumes a
kind of model or a batch structure: each works with what the model and data have, or stays out of the way.

- `PredictionsCSV`: `predict` writes one row per input: class probabilities (with class names), text, or values.
- `ConfusionMatrixImage`: for a classifier, TensorBoard shows the validation confusion matrix after every validation.
- `TimedProgressBar`: Lightning's TQDM bar, redrawn by time, not every n batches.
- `Throughput`: samples/s, the share of time the loop waits for data, and on a GPU the model FLOPs utilisation.
  (Lightning's ThroughputMonitor counts samples/s and FLOPs but does not separate the wait for data, which is what
  tells a slow loader apart.)
"""

import contextlib
import csv
import dataclasses
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, Callback, TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import convert_inf
from lightning.pytorch.profilers import PassThroughProfiler

from .flops import peak_flops


class PredictionsCSV(BasePredictionWriter):
    """Writes what `predict_step` returns to a CSV file, one row per input.

    Columns: `index` in the predict dataset, `file` when the dataset has files (an ImageFolder, a folder of new
    images), then by what predict_step returns for a batch: class probabilities (a 2-D tensor whose rows are
    non-negative and sum to 1) give `prediction`, the most likely class (named by the DataModule's `classes`, when it
    has them), and `p_<class>` for every class; any other 2-D tensor (a regression's outputs) gives `y_0`, `y_1`, ...;
    a list of strings or a 1-D tensor gives `prediction`, the text or the value.

    Args:
        path: the CSV file; the CLI sets it to `<default_root_dir>/predictions.csv`.
    """

    def __init__(self, path: str) -> None:
        super().__init__(write_interval="epoch")
        self.path = Path(path)

    def write_on_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, predictions, batch_indices) -> None:
        dataset = trainer.predict_dataloaders.dataset
        files = getattr(dataset, "files", None) or [path for path, _ in getattr(dataset, "samples", [])] or None
        tensors = [batch for batch in predictions if isinstance(batch, torch.Tensor)]
        matrix = bool(tensors) and len(tensors) == len(predictions) and all(t.ndim == 2 for t in tensors)
        probabilities = matrix and all(is_a_distribution(t) for t in tensors)
        width = tensors[0].shape[1] if matrix else 0
        classes = getattr(trainer.datamodule, "classes", None) or [str(i) for i in range(width)]
        if probabilities:
            columns = ["prediction", *(f"p_{c}" for c in classes)]
        else:
            columns = [f"y_{i}" for i in range(width)] if matrix else ["prediction"]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["index", *(["file"] * bool(files)), *columns])
            for batch, indices in zip(predictions, batch_indices[0], strict=True):
                rows = batch.float().tolist() if isinstance(batch, torch.Tensor) else list(batch)
                for index, row in zip(indices, rows, strict=True):
                    file = [files[index]] if files else []
                    if probabilities:
                        best = classes[max(range(len(row)), key=row.__getitem__)]
                        writer.writerow([index, *file, best, *(f"{p:.6f}" for p in row)])
                    else:
                        writer.writerow([index, *file, *(row if matrix else [row])])
        print(f"predictions written to {self.path}")


def is_a_distribution(batch: torch.Tensor) -> bool:
    """Whether every row holds probabilities: a floating-point tensor, non-negative, each row summing to 1."""
    rows = batch.float()
    return batch.is_floating_point() and bool((rows >= 0).all()) and bool(((rows.sum(-1) - 1).abs() < 1e-3).all())


class ConfusionMatrixImage(Callback):
    """Logs the validation confusion matrix to TensorBoard as a grayscale image, rows normalised (recall per class).

    Row i, column j: the share of class-i inputs predicted as j; a perfect model draws a white diagonal.

    It attaches to classifiers: a model with a `num_classes` hyperparameter whose validation_step returns the
    logits, (batch, num_classes), of (inputs, targets) batches. With any other model it stays silent.
    """

    def __init__(self, pixels_per_cell: int = 16) -> None:
        self.pixels_per_cell = pixels_per_cell
        self.matrix = None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from torchmetrics.classification import MulticlassConfusionMatrix

        num_classes = getattr(pl_module.hparams, "num_classes", None)
        self.matrix = None
        if isinstance(num_classes, int) and num_classes > 1:
            self.matrix = MulticlassConfusionMatrix(num_classes, normalize="true").to(pl_module.device)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.matrix is None:
            return
        targets = batch[1] if isinstance(batch, list | tuple) and len(batch) == 2 else None
        num_classes = self.matrix.num_classes
        if not isinstance(outputs, torch.Tensor) or not isinstance(targets, torch.Tensor) or targets.ndim != 1:
            self.matrix = None  # not a classifier's logits and targets: this model gets no confusion matrix
        elif outputs.shape != (len(targets), num_classes):
            self.matrix = None
        else:
            self.matrix.update(outputs.argmax(dim=-1), targets)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.matrix is None or self.matrix.update_count == 0:
            return
        matrix = self.matrix.compute().nan_to_num(0.0)  # syncs across ranks
        image = matrix.repeat_interleave(self.pixels_per_cell, 0).repeat_interleave(self.pixels_per_cell, 1)
        for logger in trainer.loggers:
            if trainer.is_global_zero and not trainer.sanity_checking and hasattr(logger.experiment, "add_image"):
                logger.experiment.add_image("val/confusion_matrix", image.unsqueeze(0).cpu(), trainer.global_step)


class TimedProgressBar(TQDMProgressBar):
    """Lightning's TQDM progress bar, redrawn at most every `refresh_seconds` instead of every n batches and up to
    four times at each epoch boundary. A redraw costs ~0.3 ms (the metrics shown are gathered for it): Lightning's
    bar cost 1.9% of a digits step at one redraw every 10 batches, and its epoch-boundary redraws alone ~0.3% of the
    19-step digits epochs (benchmarks/feature_costs.py). A fixed batch count also redraws fast steps too often and
    slow ones too rarely. With `leave=True`, each epoch's bar is left with its final count, as Lightning's is."""

    def __init__(self, refresh_seconds: float = 1.0, leave: bool = False) -> None:
        super().__init__(refresh_rate=1, leave=leave)
        self.refresh_seconds = refresh_seconds
        self._drawn = 0.0

    def _due(self) -> bool:
        now = time.monotonic()
        if now - self._drawn >= self.refresh_seconds:
            self._drawn = now
            return True
        return False

    def _should_update(self, current: int, total: int) -> bool:  # Lightning asks this at each evaluation batch
        return self.is_enabled and ((self._leave and current == total) or self._due())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        bar = self.train_progress_bar
        bar.n = batch_idx + 1  # counted at every batch, so that any redraw (after validation too) shows it
        if self._should_update(bar.n, bar.total):
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # (this redraws)

    def on_train_epoch_start(self, trainer: L.Trainer, *_) -> None:
        if self._leave:
            return super().on_train_epoch_start(trainer)
        bar = self.train_progress_bar
        bar.set_description(f"Epoch {trainer.current_epoch}", refresh=False)
        due = self._due()
        if not due:  # tqdm's reset always redraws: shadowed for this call, the next timed redraw shows the epoch
            bar.refresh = lambda *args, **kwargs: None
        try:
            bar.reset(convert_inf(self.total_train_batches))
        finally:
            if not due:
                del bar.refresh
        bar.initial = 0

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._leave or self._due():
            super().on_train_epoch_end(trainer, pl_module)


class Throughput(Callback):
    """Logs `perf/samples_per_sec` and `perf/data_wait_share` on the steps the logger writes, and
    `perf/epoch_seconds` at every epoch end. On a GPU whose peak is known (flops.py) it also logs `perf/mfu`, the
    model FLOPs utilisation: samples/s x the model's training FLOPs per sample (its `flops_per_sample()`,
    counted once) / the GPU's dense peak FLOP/s at the run's precision.

    They go straight to the loggers, as with Lightning's own LearningRateMonitor and ThroughputMonitor: through
    `self.log` each value would cost ~0.6 ms of Python (measured), 4% of a digits step. So they are not in
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
            write_to_loggers(trainer, {"perf/epoch_seconds": seconds}, step=trainer.global_step - 1)

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
        if self._seconds > 0 and trainer._logger_connector.should_update_logs:
            self.latest = {"perf/samples_per_sec": self._samples / self._seconds}
            self.latest["perf/data_wait_share"] = self._waiting / self._seconds
            if self._flops_per_sample is not None:
                self.latest["perf/mfu"] = self.latest["perf/samples_per_sec"] * self._flops_per_sample / self._peak
            write_to_loggers(trainer, self.latest, step=trainer.global_step - 1)  # the step of this batch
            self._samples, self._seconds, self._waiting = 0, 0.0, 0.0


def samples_in(batch) -> int:
    """The number of samples in a batch of any structure: the first dimension of its first tensor, found in tuples,
    lists, dicts and dataclasses (Lightning's own extract_batch_size, which also looks into objects' attributes here);
    1 for a batch without a tensor."""
    from lightning.pytorch.utilities.data import extract_batch_size

    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        batch = {field.name: getattr(batch, field.name) for field in dataclasses.fields(batch)}
    elif not isinstance(batch, torch.Tensor | list | tuple | dict) and hasattr(batch, "__dict__"):
        batch = vars(batch)
    try:
        return extract_batch_size(batch)
    except Exception:  # noqa: BLE001 - Lightning raises a MisconfigurationException, which is no mistake here
        return 1


def write_to_loggers(trainer: L.Trainer, metrics: dict[str, float], step: int) -> None:
    """Straight to every logger, without the flush that Lightning's own path makes after each write (a flush per
    logged step cost ~50 us of a digits step, measured; LastCheckpoint flushes the loggers before each checkpoint,
    which is when it matters)."""
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
        PassThroughProfiler gives a generator-based context manager that costs 0.6 us a call; this one costs 0.1."""
        return self._NOTHING if self._passes_through else self.profiler.profile(action_name)

    def __getattr__(self, name: str):
        return getattr(self.profiler, name)
