"""Training runs of the stand-in task in processes of their own, killed at chosen points and resumed, and the
comparisons that say whether two runs ended with the same bits: weights, optimizer and schedule states, generators
and every logged value."""

import contextlib
import os
import signal
import time
from pathlib import Path

import torch

from helpers.cli import QUICK, STAND_IN, WarmProcess, cli, extra_config, resume, scalars, started

# The stand-in task, 3 epochs of 19 batches, a checkpoint every 5 optimizer steps and a logged loss at every step.
BASE = [
    *STAND_IN,
    "--trainer.max_epochs=3",
    "--last_checkpoint.every_n_steps=5",
    "--trainer.log_every_n_steps=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]

# 2-process DDP on CPU, started by Lightning's own launcher.
DDP = ["--trainer.strategy=ddp", "--trainer.accelerator=cpu", "--trainer.devices=2"]


def start_fit(run_dir: Path, *args: str) -> WarmProcess:
    """`fit` in a process of its own (its own session: a kill reaches every DDP rank and loader worker)."""
    return started(WarmProcess(["fit", f"--trainer.default_root_dir={run_dir}", *BASE, *args]))


def finish(process: WarmProcess, timeout: float = 300) -> None:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]


def kill_group(process: WarmProcess) -> bool:
    """SIGKILL the process and all it started; whether the kill ended it (it may have ended a moment before)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.wait(timeout=30) == -signal.SIGKILL


def freeze_config(tmp_path: Path, **init_args) -> str:
    """A config that stops the run at a kill point and writes tmp_path/frozen: helpers.kill_points.FreezeAt at a hook,
    or helpers.faults.StallingCheckpointIO inside a write of last.ckpt (hook="checkpoint_write")."""
    marker = str(tmp_path / "frozen")
    hook = init_args.pop("hook")
    if hook == "checkpoint_write":
        stall = {"class_path": "helpers.faults.StallingCheckpointIO", "init_args": {"marker": marker, **init_args}}
        return extra_config(tmp_path / "freeze.yaml", plugins=[stall])
    freeze = {"class_path": "helpers.kill_points.FreezeAt", "init_args": {"marker": marker, "hook": hook, **init_args}}
    return extra_config(tmp_path / "freeze.yaml", callbacks=[freeze])


def wait_until_frozen(process: WarmProcess, marker: Path) -> None:
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert process.poll() is None, f"run ended before the kill point: {process.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"no kill point in 300 s; stderr and stacks: {process.stacks()}"
        time.sleep(0.05)


def kill_when_frozen(process: WarmProcess, marker: Path) -> None:
    wait_until_frozen(process, marker)
    kill_group(process)


def run_killed_and_resumed(tmp_path: Path, run_dir: Path, args: list[str], **freeze) -> None:
    """Freeze the run at the kill point, SIGKILL it from outside, then resume it to the end."""
    process = start_fit(run_dir, "-c", freeze_config(tmp_path, **freeze), *args)
    kill_when_frozen(process, tmp_path / "frozen")
    assert (run_dir / "checkpoints" / "last.ckpt").is_file(), "nothing to resume from"
    if freeze["hook"] == "checkpoint_write":  # killed with the new checkpoint half-written beside the old one
        assert (run_dir / "checkpoints" / "last.ckpt.tmp").is_file()
    torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)  # loadable whatever the kill point
    resume_fit(run_dir, *args)
    assert not (run_dir / "checkpoints" / "last.ckpt.tmp").exists()


def resume_fit(run_dir: Path, *args: str) -> None:
    """`fit --ckpt_path last` in this process: a fresh process costs ~6 s of imports, and the resumed run's state
    comes from the checkpoint alone (the reference and the killed run are processes of their own). Under DDP in a
    child process: Lightning's launcher starts the other rank by running this process's command again."""
    if "--trainer.strategy=ddp" in args:
        finish(start_fit(run_dir, "--ckpt_path=last", *args))
    else:
        resume(run_dir, *BASE[len(STAND_IN) :], *args)


def assert_same_state(a: object, b: object, where: str = "checkpoint") -> None:
    """Equal, not close: tensors bit for bit, containers recursively."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_same_run(reference_dir: Path, resumed_dir: Path) -> None:
    ref = torch.load(reference_dir / "checkpoints" / "last.ckpt", weights_only=True)
    got = torch.load(resumed_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ref.keys() == got.keys()
    for key in ("state_dict", "optimizer_states", "lr_schedulers", "global_step", "epoch", "rng_states"):
        assert_same_state(ref[key], got[key], key)
    if "current_model_state" in ref:  # with EMA: state_dict is the average, this the trained weights
        assert_same_state(ref["current_model_state"], got["current_model_state"], "current_model_state")
        ema = next(key for key in ref["callbacks"] if "EMAWeightAveraging" in key)
        assert_same_state(ref["callbacks"][ema], got["callbacks"][ema], ema)
    assert_same_logs(reference_dir, resumed_dir)


def assert_same_logs(reference_dir: Path, resumed_dir: Path) -> None:
    """Every scalar the runs logged (the module's own, whatever their names, the recipe's, validation's), each at the
    same steps with the same values: none missing, none repeated. Only the timings (perf/*) differ."""
    ref, got = scalars(reference_dir), scalars(resumed_dir)
    tags = sorted(tag for tag in ref.keys() | got.keys() if not tag.startswith("perf/"))
    assert tags, "nothing logged"
    for tag in tags:
        ref_steps, got_steps = [step for step, _ in ref.get(tag, [])], [step for step, _ in got.get(tag, [])]
        missing, extra = sorted(set(ref_steps) - set(got_steps)), sorted(set(got_steps) - set(ref_steps))
        assert got_steps == ref_steps, f"logged {tag} steps missing {missing}, extra {extra}, or repeated"
        assert got[tag] == ref[tag], tag


def assert_kill_and_resume_exact(tmp_path: Path, tmp_path_factory, args: list[str], **freeze) -> Path:
    """Kill a run with `args` at the `freeze` point, resume it, and compare with the uninterrupted run; returns the
    resumed run's directory."""
    reference = reference_run(tmp_path_factory, args)
    run_dir = tmp_path / "run"
    run_killed_and_resumed(tmp_path, run_dir, args, **freeze)
    assert_same_run(reference, run_dir)
    return run_dir


REFERENCES: dict[tuple[str, ...], Path] = {}


def reference_run(tmp_path_factory, args: list[str]) -> Path:
    """The uninterrupted run for these arguments, computed once per session."""
    key = tuple(args)
    if key not in REFERENCES:
        run_dir = tmp_path_factory.mktemp("reference") / "run"
        finish(start_fit(run_dir, *args))
        REFERENCES[key] = run_dir
    return REFERENCES[key]


KILL_POINTS = {
    "mid_epoch": {"hook": "on_train_batch_end", "step": 8},
    "mid_second_epoch": {"hook": "on_train_batch_end", "step": 27},
    "epoch_end": {"hook": "on_train_epoch_end", "step": 1},
    "during_validation": {"hook": "on_validation_batch_end", "step": 19, "batch_idx": 2},
    "during_checkpoint_write": {"hook": "checkpoint_write", "step": 12},
}


def log_steps_against_last_ckpt(run_dir: Path, monkeypatch) -> list[tuple[int, int]]:
    """Train with a checkpoint every 2 steps; at every write to TensorBoard, (the step written, the step last.ckpt
    holds then). The model also logs its loss with `self.log`, as a user's own metric would be: Lightning writes
    those after on_train_batch_end, where the checkpoint is taken."""
    from template_package.engine.report.loggers import RunTensorBoardLogger

    from helpers.stand_in import StandInClassifier

    last, seen = run_dir / "checkpoints" / "last.ckpt", []
    log_metrics, training_step = RunTensorBoardLogger.log_metrics, StandInClassifier.training_step

    def training_step_with_a_users_metric(self, batch, batch_idx):
        loss = training_step(self, batch, batch_idx)
        self.log("user/loss", loss)
        return loss

    def spy(self, metrics, step=None):
        seen.append((step, torch.load(last, weights_only=True)["global_step"] if last.exists() else 0))
        return log_metrics(self, metrics, step)

    monkeypatch.setattr(RunTensorBoardLogger, "log_metrics", spy)
    monkeypatch.setattr(StandInClassifier, "training_step", training_step_with_a_users_metric)
    cli("fit", f"--trainer.default_root_dir={run_dir}", "--last_checkpoint.every_n_steps=2",
        "--trainer.log_every_n_steps=1", *QUICK)  # fmt: skip
    return seen


def weights_with_workers(tmp_path, counts: tuple[int, ...]) -> dict[int, dict[str, torch.Tensor]]:
    """The final weights of a short stand-in run with random noise drawn per sample, for each number of workers."""
    weights = {}
    for workers in counts:
        run_dir = tmp_path / f"workers{workers}"
        cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--data.augment=true",
            f"--data.num_workers={workers}")  # fmt: skip
        weights[workers] = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    return weights
