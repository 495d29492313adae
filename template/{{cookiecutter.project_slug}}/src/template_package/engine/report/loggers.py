"""Loggers that resume with their run: a run killed and resumed with `fit --ckpt_path last` shows every step once.

A resumed run logs again every step from its checkpoint's on, and the killed run may have logged some of them
already. TensorBoard hides those itself (`purge_step`, which the CLI sets); the CSV and MLflow loggers do the same:

- `RunTensorBoardLogger`, the default: Lightning's TensorBoardLogger writing each call's scalars as one event.
  Lightning's writes an event per scalar (torch's `add_scalar`), each built, serialized and checksummed in Python on
  its own, so that a logged step's several scalars cost several times one event (benchmarks/logger_writes.py).
- `RunCSVLogger`: `metrics.csv` in the run directory. Lightning's CSVLogger deletes an existing metrics.csv when it
  starts in a folder that is not empty, so a resumed run lost everything logged before; this one keeps the rows
  before `purge_step` and drops the others, which the resumed run logs again.
- `RunMLFlowLogger`: one MLflow run per run directory (tagged `run_dir`), continued by a resumed run. MLflow cannot
  delete a logged value, so a step the MLflow run already holds is not logged again: a resumed run logs the same
  values it logged before it was killed (exact resume), so nothing is lost and nothing appears twice.

Depends on lightning, torch and tensorboard (and mlflow, for RunMLFlowLogger: `pip install -e ".[mlflow]"`).
"""

import csv
import importlib.util
import numbers
from collections.abc import Mapping
from pathlib import Path

from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only
from tensorboard.compat.proto.summary_pb2 import Summary
from torch import Tensor


class RunTensorBoardLogger(TensorBoardLogger):
    """Lightning's TensorBoardLogger, writing the scalars of each `log_metrics` call as one TensorBoard event (one
    Summary of many values, as TensorFlow's merged summaries are): TensorBoard shows the same curves. A call with a
    dict of values (Lightning's `add_scalars`) or a value that is not a number goes Lightning's way.

    Args:
        save_dir: the run directory; the CLI sets it. Every other argument is Lightning's TensorBoardLogger's and
            torch's SummaryWriter's (`purge_step`, which the CLI sets on a resume).
        prefix: put before every name, joined with "-", as Lightning's loggers do.
    """

    def __init__(self, save_dir: str = ".", prefix: str = "", **kwargs) -> None:
        super().__init__(save_dir, prefix=prefix, **kwargs)
        self.tag_prefix = f"{prefix}{self.LOGGER_JOIN_CHAR}" if prefix else ""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        file_writer = self.experiment.file_writer  # None once closed: Lightning's way opens another
        if file_writer is None or not all(isinstance(value, Tensor | numbers.Number) for value in metrics.values()):
            super().log_metrics(metrics, step)
            return
        values = [Summary.Value(tag=self.tag_prefix + name, simple_value=float(v)) for name, v in metrics.items()]
        file_writer.add_summary(Summary(value=values), step)


class _PurgingWriter(ExperimentWriter):
    """Lightning's CSV writer, keeping an existing metrics.csv's rows before `purge_step` instead of deleting it."""

    def __init__(self, log_dir: str, purge_step: int | None) -> None:
        self.purge_step = purge_step
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:  # called by __init__
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            header, rows = reader.fieldnames or [], list(reader)
        if self.purge_step is not None:
            rows = [row for row in rows if int(float(row["step"])) < self.purge_step]
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows)
        self.metrics_keys = list(header)  # later rows are appended under the same header


class RunCSVLogger(CSVLogger):
    """CSVLogger writing `<save_dir>/metrics.csv` (no name or version folders) that resumes with its run.

    Every logged row is written at once: Lightning's CSVLogger keeps up to 100 steps in memory, which a kill loses
    while last.ckpt may already hold a later step, so they would be missing for good.

    Args:
        save_dir: the run directory; the CLI sets it.
        purge_step: the step a resumed fit starts from: rows from it on are dropped (the CLI sets it; None keeps
            every row, for validate and test).
        prefix: put before every name, joined with "-", as Lightning's loggers do.
    """

    def __init__(self, save_dir: str = ".", purge_step: int | None = None, prefix: str = "") -> None:
        super().__init__(save_dir, name="", version="", prefix=prefix, flush_logs_every_n_steps=1)
        self.purge_step = purge_step
        self._writer: _PurgingWriter | None = None  # made at the first write, on rank 0 alone

    @property
    @rank_zero_experiment  # (as Lightning's own: the other ranks get a stand-in, and never touch metrics.csv)
    def experiment(self) -> ExperimentWriter:
        if self._writer is None:
            get_filesystem(self.root_dir).makedirs(self.root_dir, exist_ok=True)
            self._writer = _PurgingWriter(self.log_dir, self.purge_step)
        return self._writer

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Write what the writer holds yet, as Lightning's finalize does for its own writer; nothing without one."""
        if self._writer is not None:
            self.save()


class RunMLFlowLogger(MLFlowLogger):
    """MLFlowLogger with one MLflow run per run directory, continued when the run is resumed.

    Args:
        tracking_uri: where MLflow stores runs. A database, e.g. `sqlite:///runs/mlflow.db` beside the run
            directories: MLflow 3.13 and later refuse the `file:./mlruns` store that Lightning's logger defaults to.
        experiment_name: the MLflow experiment.
        run_dir: the run directory, tagged on the MLflow run to find it again; the CLI sets it. The MLflow run that
            holds this tag is the one continued (Lightning's `run_id`); without one, a new run starts.
    """

    def __init__(self, tracking_uri: str, experiment_name: str = "default", run_dir: str = ".", **kwargs) -> None:
        if importlib.util.find_spec("mlflow") is None:
            raise ModuleNotFoundError('the MLflow logger needs mlflow: pip install -e ".[mlflow]"')
        self.run_dir = run_dir if "://" in run_dir else str(Path(run_dir).resolve())  # a folder, or a run's URL
        self.tracking_uri, self.experiment_name = tracking_uri, experiment_name
        self._logged: dict[str, set[int]] = {}  # steps the MLflow run holds, by metric
        super().__init__(experiment_name=experiment_name, tracking_uri=tracking_uri, run_name=Path(run_dir).name,
                         tags={"run_dir": self.run_dir}, run_id=self._existing_run_id(), **kwargs)  # fmt: skip

    def _existing_run_id(self) -> str | None:
        """The MLflow run of this run directory, if an earlier fit made one (and what it holds)."""
        from mlflow import MlflowClient

        client = MlflowClient(self.tracking_uri)
        experiment = client.get_experiment_by_name(self.experiment_name)
        if experiment is None:
            return None
        runs = client.search_runs([experiment.experiment_id], filter_string=f"tags.run_dir = '{self.run_dir}'")
        if not runs:
            return None
        run = runs[0]
        for key in run.data.metrics:
            self._logged[key] = {metric.step for metric in client.get_metric_history(run.info.run_id, key)}
        client.update_run(run.info.run_id, status="RUNNING")
        return run.info.run_id

    def log_metrics(self, metrics, step: int | None = None) -> None:
        new = {key: value for key, value in metrics.items() if (step or 0) not in self._logged.get(key, ())}
        if new:
            super().log_metrics(new, step)
