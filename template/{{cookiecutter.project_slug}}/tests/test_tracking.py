"""Experiment tracking that resumes with its run (configs/mlflow.yaml, configs/csv.yaml): a run killed and resumed
shows each step once, none missing, with the values of the run that never stopped; read back with MlflowClient."""

import csv
from pathlib import Path

import pytest

from helpers.cli import cli, extra_config
from helpers.runs import DDP, assert_same_run, reference_run, run_killed_and_resumed

LOGGERS = "template_package.engine.report.loggers"

mlflow = pytest.importorskip("mlflow", reason='MLflow tracking needs the mlflow extra: pip install -e ".[mlflow]"')


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> tuple[list[str], str]:
    """The fit options that add MLflow (a SQLite store of this test module's) and CSV to TensorBoard, and that
    store's URI."""
    folder = tmp_path_factory.mktemp("tracking")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    loggers = [{"class_path": f"{LOGGERS}.RunMLFlowLogger", "init_args": {"tracking_uri": uri}},
               {"class_path": f"{LOGGERS}.RunCSVLogger"}]  # fmt: skip
    return ["-c", extra_config(folder / "tracking.yaml", loggers=loggers)], uri


def mlflow_series(uri: str, run_dir: Path, key: str) -> list[tuple[int, float]]:
    client = mlflow.MlflowClient(uri)
    [run] = client.search_runs([client.get_experiment_by_name("default").experiment_id],
                               filter_string=f"tags.run_dir = '{run_dir.resolve()}'")  # fmt: skip
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def csv_series(run_dir: Path, key: str) -> list[tuple[int, float]]:
    with (run_dir / "metrics.csv").open() as file:
        return [(int(row["step"]), float(row[key])) for row in csv.DictReader(file) if row.get(key)]


@pytest.mark.slow
def test_a_killed_and_resumed_run_logs_each_step_once_to_mlflow_and_csv(tmp_path, tmp_path_factory, tracking):
    args, uri = tracking
    reference = reference_run(tmp_path_factory, args)
    run_dir = tmp_path / "run"
    run_killed_and_resumed(tmp_path, run_dir, args, hook="on_train_batch_end", step=12)  # last.ckpt holds step 10
    assert_same_run(reference, run_dir)  # the weights, and TensorBoard's series
    for key in ("train/loss", "val/acc", "lr"):
        expected = mlflow_series(uri, reference, key)
        assert len(expected) >= 3 and len({step for step, _ in expected}) == len(expected)
        assert mlflow_series(uri, run_dir, key) == expected, key  # one MLflow run, each step once, same values
        assert csv_series(run_dir, key) == csv_series(reference, key) == expected, key


@pytest.mark.slow
def test_a_killed_and_resumed_ddp_run_logs_each_step_once_to_csv(tmp_path, tmp_path_factory):
    """On 2 processes: only rank 0 writes metrics.csv. (Every rank rewrote it as its resumed run started, and the
    file lost every row before the checkpoint, or the run crashed reading a row the other rank was writing.)"""
    args = [*DDP, "-c", str(Path(__file__).resolve().parents[1] / "configs" / "csv.yaml")]
    reference = reference_run(tmp_path_factory, args)
    run_dir = tmp_path / "run"
    run_killed_and_resumed(tmp_path, run_dir, args, hook="on_train_batch_end", step=12)  # last.ckpt holds step 10
    assert_same_run(reference, run_dir)
    for key in ("train/loss", "val/acc", "lr"):
        expected = csv_series(reference, key)
        assert len(expected) >= 3 and len({step for step, _ in expected}) == len(expected)
        assert csv_series(run_dir, key) == expected, key


def test_a_missing_tracking_extra_costs_one_line(run_dir, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else find_spec(name, *a))
    config = Path(__file__).resolve().parents[1] / "configs" / "mlflow.yaml"
    with pytest.raises(SystemExit) as stop:
        cli("fit", "-c", str(config), f"--trainer.default_root_dir={run_dir}")
    assert stop.value.code == 'error: RunMLFlowLogger needs mlflow, which is not installed: pip install -e ".[mlflow]"'


def test_a_logger_of_a_run_directory_continues_its_mlflow_run_and_logs_a_held_step_once(tmp_path):
    from template_package.engine.report.loggers import RunMLFlowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = RunMLFlowLogger(uri, run_dir=str(tmp_path / "run"))
    first.log_metrics({"val/acc": 0.5}, step=3)
    first.finalize("success")
    second = RunMLFlowLogger(uri, run_dir=str(tmp_path / "run"))  # the run resumed
    assert second.run_id == first.run_id
    second.log_metrics({"val/acc": 0.25}, step=3)  # held by the MLflow run already
    second.log_metrics({"val/acc": 0.75}, step=4)
    history = mlflow.MlflowClient(uri).get_metric_history(first.run_id, "val/acc")
    assert sorted((metric.step, metric.value) for metric in history) == [(3, 0.5), (4, 0.75)]
    assert RunMLFlowLogger(uri, run_dir=str(tmp_path / "other")).run_id != first.run_id
