"""Sweeps of the stand-in task's short trials in processes of their own."""

from pathlib import Path

from helpers.cli import PROJECT_ROOT, QUICK, STAND_IN, WarmProcess, started

# Short trials: 2 epochs of 6 batches, validated on 3 batches; a checkpoint every 4 steps.
TRIAL = [*STAND_IN, *QUICK, "--trainer.limit_val_batches=3", "--last_checkpoint.every_n_steps=4",
         "--trainer.enable_model_summary=false"]  # fmt: skip

SWEEP_YAML = str(PROJECT_ROOT / "configs" / "sweep.yaml")


def sweep_command(folder: Path, n_trials: int, *args: str) -> list[str]:
    return ["sweep", "-c", SWEEP_YAML, f"--sweep.dir={folder}", f"--sweep.n_trials={n_trials}", *TRIAL, *args]


def start_sweep(folder: Path, n_trials: int, *args: str) -> WarmProcess:
    folder.parent.mkdir(parents=True, exist_ok=True)
    return started(WarmProcess(sweep_command(folder, n_trials, *args), cwd=folder.parent))


def finish_sweep(process: WarmProcess) -> str:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-3000:]
    return out
