"""Sharded runs (configs/fsdp.yaml): where their last.ckpt is, a fault injected into their saves, and comparisons."""

import os
from pathlib import Path

import yaml

from template_package.engine.resume.whole_checkpoint import read_whole

from .runs import assert_same_state
from helpers.cli import PROJECT_ROOT, scalars

FSDP = str(PROJECT_ROOT / "configs" / "fsdp.yaml")


def last_ckpt(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last.ckpt"


def faulty(tmp_path: Path, **init_args) -> str:
    """A config whose strategy is helpers.sharded_faults.FaultyShardedStrategy (a fault inside one rank's save)."""
    strategy = {"class_path": "helpers.sharded_faults.FaultyShardedStrategy",
                "init_args": {"marker": str(tmp_path / "frozen"), **init_args}}  # fmt: skip
    path = tmp_path / "faulty.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"strategy": strategy}}))
    return str(path)


def assert_same_sharded_run(reference: Path, run_dir: Path) -> None:
    """Every weight, optimizer and schedule state, generator and loop counter bit for bit, and the same logged
    train/loss series."""
    ref, got = read_whole(last_ckpt(reference)), read_whole(last_ckpt(run_dir))
    for key in ("state_dict", "optimizer_states", "lr_schedulers", "global_step", "epoch", "rng_states", "loops"):
        assert_same_state(ref[key], got[key], key)
    assert scalars(run_dir)["train/loss"] == scalars(reference)["train/loss"]


def assert_no_leftovers(run_dir: Path) -> None:
    """Nothing in checkpoints/ but links and the folders they point to."""
    entries = list((run_dir / "checkpoints").iterdir())
    linked = {os.readlink(entry) for entry in entries if entry.is_symlink()}
    assert {e.name for e in entries if not e.is_symlink()} == linked


def is_running(pid: int) -> bool:
    """Whether the process exists and is not a zombie (one that ended, not yet reaped by its new parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
