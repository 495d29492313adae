"""The engine's loggers as Lightning's: the default, RunTensorBoardLogger, writes each `log_metrics` call as one
TensorBoard event, and TensorBoard reads the same scalars as from Lightning's TensorBoardLogger, which writes an event
per scalar; RunCSVLogger takes Lightning's prefix. (Across a resume: tests/test_tracking.py.)"""

import csv

import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from template_package.engine.report.loggers import RunCSVLogger, RunTensorBoardLogger

from helpers.cli import scalars

CALLS = [
    ({"train/loss": torch.tensor(2.5), "lr": 3e-3, "train/grad_norm": np.float32(0.75), "train/clip_share": 1}, 9),
    ({"train/loss": torch.tensor([1.25]), "lr": 2e-3, "train/grad_norm": 0.5, "train/clip_share": 0.0}, 19),
    ({"perf/epoch_seconds": 1.5}, 19),
]


def log_all(logger: TensorBoardLogger) -> None:
    for metrics, step in CALLS:
        logger.log_metrics(metrics, step=step)
    logger.finalize("success")


def events_with_values(run_dir) -> list[int]:
    """The number of values of each event that holds scalars, in the order written."""
    [path] = run_dir.glob("events.out.tfevents.*")
    return [len(event.summary.value) for event in EventFileLoader(str(path)).Load() if event.summary.value]


def test_each_call_is_one_event_that_tensorboard_reads_as_lightnings_logger_writes(tmp_path):
    ours, lightnings = tmp_path / "ours", tmp_path / "lightnings"
    log_all(RunTensorBoardLogger(str(ours), name="", version=""))
    log_all(TensorBoardLogger(str(lightnings), name="", version=""))
    assert events_with_values(ours) == [4, 4, 1]
    assert events_with_values(lightnings) == [1] * 9
    assert scalars(ours) == scalars(lightnings)
    assert scalars(ours)["train/loss"] == [(9, 2.5), (19, 1.25)]


def test_a_prefix_a_dict_and_a_write_after_finalize_read_as_lightnings_logger_writes(tmp_path):
    def run(kind, run_dir) -> None:
        logger = kind(str(run_dir), name="", version="", prefix="fold0")
        logger.log_metrics({"val/acc": 0.5, "scores": {"a": 1.0, "b": 2.0}}, step=1)
        logger.finalize("success")  # (closes the writer: a later fit or test in the process logs on)
        logger.log_metrics({"test/acc": 0.75}, step=2)
        logger.finalize("success")

    run(RunTensorBoardLogger, tmp_path / "ours")
    run(TensorBoardLogger, tmp_path / "lightnings")
    assert scalars(tmp_path / "ours") == scalars(tmp_path / "lightnings")
    assert scalars(tmp_path / "ours")["fold0-test/acc"] == [(2, 0.75)]


def test_the_csv_logger_puts_a_prefix_before_every_name_as_lightnings_loggers_do(tmp_path):
    logger = RunCSVLogger(str(tmp_path), prefix="fold0")
    logger.log_metrics({"val/acc": 0.5}, step=3)
    logger.finalize("success")
    with (tmp_path / "metrics.csv").open(newline="") as file:
        assert list(csv.DictReader(file)) == [{"fold0-val/acc": "0.5", "step": "3"}]


def test_the_csv_logger_writes_at_finalize_what_its_writer_holds_and_nothing_without_a_writer(tmp_path):
    logger = RunCSVLogger(str(tmp_path / "run"))
    logger.experiment.log_metrics({"val/acc": 0.5}, step=3)  # held by the writer until a save
    assert not (tmp_path / "run" / "metrics.csv").exists()
    logger.finalize("success")
    with (tmp_path / "run" / "metrics.csv").open(newline="") as file:
        assert list(csv.DictReader(file)) == [{"val/acc": "0.5", "step": "3"}]
    RunCSVLogger(str(tmp_path / "unused")).finalize("success")  # (a process that logged nothing)
    assert not (tmp_path / "unused").exists()
