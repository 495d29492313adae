"""What a run's steps read, recorded by helpers.elastic_task.RecordSteps into a file of the test's."""

from pathlib import Path

from helpers.cli import extra_config


def record(tmp_path: Path, name: str) -> tuple[str, Path]:
    path = tmp_path / f"{name}.jsonl"
    callback = {"class_path": "helpers.elastic_task.RecordSteps", "init_args": {"path": str(path)}}
    return extra_config(tmp_path / f"{name}.yaml", callbacks=[callback]), path
