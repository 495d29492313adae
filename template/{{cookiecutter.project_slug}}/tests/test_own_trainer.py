"""docs/own-trainer.md as written: its plain script, and a project laid out as lightning-hydra-template's with the
chapter's configs (helpers/own_trainer.py), each SIGKILLed once its first last.ckpt is written and run again with the
same command, end with the weights of their uninterrupted runs, their epoch metrics' states included."""

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers.cli import started, subprocess_env
from helpers.own_trainer import chapter_files, hydra_project
from helpers.runs import assert_same_state

pytestmark = pytest.mark.slow


def run(command: list[str], cwd: Path, env: dict, kill_at: Path | None = None) -> int | None:
    """Run `command`; with `kill_at`, SIGKILL it (its whole group) as soon as that file exists. Its exit code, or None
    when it was killed."""
    process = started(subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True, start_new_session=True))  # fmt: skip
    while kill_at is not None and process.poll() is None and not kill_at.exists():
        time.sleep(0.002)
    if kill_at is not None and process.poll() is None:
        os.killpg(process.pid, signal.SIGSTOP)  # (at once: the run goes on while a SIGKILL is sent)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return process.returncode


def assert_killed_and_restarted_ends_as_uninterrupted(command, folders, checkpoint, last_step, env=None):
    """`command(folder)` run to its end in the first folder, and SIGKILLed once its first last.ckpt exists in the
    second, then run there again: the same state at the end. `env(folder)`: the environment of its processes."""
    reference, killed = folders
    env = env or (lambda folder: subprocess_env())
    run(command(reference), reference, env(reference))
    assert run(command(killed), killed, env(killed), kill_at=checkpoint(killed)) is None, "it ended before the kill"
    assert torch.load(checkpoint(killed), weights_only=True)["global_step"] < last_step
    run(command(killed), killed, env(killed))
    ref, got = (torch.load(checkpoint(folder), weights_only=True) for folder in folders)
    for key in ("state_dict", "optimizer_states", "global_step", "epoch_state"):
        assert_same_state(ref[key], got[key], key)
    assert got["global_step"] == last_step


def test_the_plain_script_killed_and_run_again_ends_as_one_uninterrupted_run(tmp_path):
    folders = (tmp_path / "reference", tmp_path / "killed")
    for folder in folders:
        folder.mkdir()
        (folder / "train.py").write_text(chapter_files()["train.py"])
    assert_killed_and_restarted_ends_as_uninterrupted(
        lambda folder: [sys.executable, "train.py"], folders,
        lambda folder: folder / "runs" / "plain" / "checkpoints" / "last.ckpt", last_step=48,
    )  # fmt: skip


@pytest.mark.skipif(
    importlib.util.find_spec("hydra") is None, reason="hydra-core is not installed: pip install hydra-core"
)
def test_a_lightning_hydra_template_project_killed_and_restarted_in_its_run_folder_ends_as_uninterrupted(tmp_path):
    folders = tuple(hydra_project(tmp_path / name) for name in ("reference", "killed"))

    def command(folder: Path) -> list[str]:
        run_dir, every = f"hydra.run.dir={folder / 'logs' / 'exp1'}", "callbacks.exact_resume.every_n_steps=50"
        return [sys.executable, "src/train.py", run_dir, "ckpt_path=last", every]

    assert_killed_and_restarted_ends_as_uninterrupted(
        command, folders, lambda folder: folder / "logs" / "exp1" / "checkpoints" / "last.ckpt", last_step=300,
        env=lambda folder: {**subprocess_env(), "PYTHONPATH": str(folder)},  # (its own src/, as rootutils sets it)
    )  # fmt: skip
