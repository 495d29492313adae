"""The guarantee kit: do your model and data get every guarantee of the engine? `pytest -m guarantees` runs it on the
classes configs/default.yaml names (tests/test_guarantees.py), with their init_args, as `fit` would.

Each check trains short real runs in child processes (`python -m <package> fit`), with these settings overridden:
the CPU, one process, 32-true precision, 2 epochs of at most 6 batches, 2 validation batches, a checkpoint every few
optimizer steps and train/loss logged at every step (to metrics.csv). Everything else is your config's.

- repeatable: two runs with the same settings end with the same bits;
- exact resume: a run SIGKILLed mid-epoch (after a checkpoint) and resumed with `--ckpt_path last` ends with the
  uninterrupted run's weights, optimizer and schedule states, and logged losses, bit for bit;
- workers: 0 and 2 loader workers train the same bits (when the DataModule takes `num_workers`).

A failure names the first tensor and the first logged step that differ, and the likely cause.
Depends on torch, lightning and the engine's CLI.
"""

import csv
import inspect
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import Callback

ENGINE = __package__  # run as `python -m <package>.engine fit`
SETTINGS = [
    "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=auto",
    "--trainer.precision=32-true", "--trainer.max_epochs=2", "--trainer.max_steps=-1",
    "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=1",
    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
]  # fmt: skip
COMPARED = ("state_dict", "optimizer_states", "lr_schedulers", "global_step", "epoch", "rng_states")
CAUSES = {
    "repeat": "randomness that no seed reaches: a generator created without a seed (np.random.default_rng(), "
    "random.Random(), torch.Generator() without manual_seed) or seeded from the time or os.urandom, or a kernel that "
    "is not deterministic",
    "resume": "state the checkpoint does not hold: a random generator the dataset or model keeps for itself (draw from "
    "torch's, random's or numpy's global generators instead, which the engine seeds for each sample, or from "
    "np.random.default_rng(sample_seed())), a train loader that cannot resume (see the engine's notice), or model "
    "state outside its state_dict",
    "workers": "random draws in loader workers from a generator the dataset keeps, or from each worker's own seed: "
    "draw from torch's, random's or numpy's global generators (seeded per sample) or from sample_seed()",
}


class KillAt(Callback):
    """SIGKILLs this process at the end of the batch that brings the global step to `step`, once per `marker` file
    (a resumed run goes on): the way a crash or the out-of-memory killer ends a run."""

    def __init__(self, marker: str, step: int) -> None:
        self.marker, self.step = Path(marker), step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step and not self.marker.exists():
            self.marker.write_text(str(trainer.global_step))
            os.kill(os.getpid(), signal.SIGKILL)


class GuaranteeKit:
    """Runs the checks on the model and data that `task` selects (e.g. ["--model=a.b.C"]; [] for the config's own),
    in `folder`, with the child processes' environment `env`."""

    def __init__(self, folder: Path, task: list[str] = (), env: dict[str, str] | None = None) -> None:
        self.folder, self.task = Path(folder), list(task)
        self.env = {"OMP_NUM_THREADS": "1", **(env or os.environ)}
        self._reference: Path | None = None

    # --- The checks ---------------------------------------------------------------------------------------------

    def check_repeatable(self) -> None:
        self.compare("repeat", self.reference(), self.fit("repeat"))

    def check_exact_resume(self) -> None:
        reference = self.reference()
        steps = torch.load(reference / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
        if steps < 3:
            raise AssertionError(f"the kit's run trained {steps} optimizer steps: it needs 3 or more to kill one")
        # Checkpoints every third of the run; killed a few steps after the second one: mid-way through the second
        # epoch (12 steps: written at 4 and 8, killed at 10, resumed from 8).
        every = max(1, steps // 3)
        kill = min(steps - 1, 2 * every + max(1, every // 2))
        run_dir = self.folder / "resumed"
        marker = self.folder / "killed-at"
        kill_at = {"class_path": f"{ENGINE}.guarantees.KillAt", "init_args": {"marker": str(marker), "step": kill}}
        killer = self._config("kill.yaml", callbacks=[kill_at])
        killed = self._run(run_dir, "-c", killer, f"--last_checkpoint.every_n_steps={every}", check=False)
        if killed.returncode != -signal.SIGKILL:
            raise AssertionError(f"the run to kill ended with {killed.returncode}:\n{killed.stderr[-3000:]}")
        self._run(run_dir, "--ckpt_path=last", f"--last_checkpoint.every_n_steps={every}")
        self.compare("resume", reference, run_dir, f"killed at step {marker.read_text()} and resumed from step "
                     f"{every * (int(marker.read_text()) // every)}")  # fmt: skip

    def check_workers_agree(self) -> None:
        workers = [self.fit(f"workers{count}", f"--data.num_workers={count}") for count in (0, 2)]
        self.compare("workers", *workers)

    def takes_num_workers(self) -> bool:
        """Whether the configured DataModule has a `num_workers` argument."""
        from .cli.checks import import_class

        data = (self.config().get("data") or {}).get("class_path")
        return data is not None and "num_workers" in inspect.signature(import_class(data)).parameters

    # --- Runs ----------------------------------------------------------------------------------------------------

    def reference(self) -> Path:
        if self._reference is None:
            self._reference = self.fit("uninterrupted")
        return self._reference

    def fit(self, name: str, *args: str) -> Path:
        run_dir = self.folder / name
        self._run(run_dir, *args)
        return run_dir

    def config(self) -> dict:
        """The fit config the kit's runs get, as `fit --print_config` resolves it."""
        printed = self._command("fit", *self.task, *SETTINGS, "--print_config")
        return yaml.safe_load(printed.stdout)

    def _run(self, run_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        csv_logger = self._config("csv.yaml", loggers=[{"class_path": f"{ENGINE}.report.loggers.RunCSVLogger"}])
        result = self._command("fit", *self.task, *SETTINGS, "-c", csv_logger,
                               f"--trainer.default_root_dir={run_dir}", *args, check=False)  # fmt: skip
        (run_dir.parent / f"{run_dir.name}.log").write_text(result.stdout + result.stderr)
        if check and result.returncode != 0:
            raise AssertionError(f"the kit's run in {run_dir} failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return result

    def _command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        self.folder.mkdir(parents=True, exist_ok=True)
        result = subprocess.run([sys.executable, "-m", ENGINE, *args], cwd=self.folder, env=self.env,
                                capture_output=True, text=True, timeout=900)  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args[:1])} failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return result

    def _config(self, name: str, callbacks: list[dict] = (), loggers: list[dict] = ()) -> str:
        trainer = {"callbacks+": list(callbacks)} if callbacks else {"logger": list(loggers)}
        path = self.folder / name
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"trainer": trainer}))
        return str(path)

    # --- Comparing -------------------------------------------------------------------------------------------------

    def compare(self, check: str, expected: Path, got: Path, how: str = "") -> None:
        """Raise AssertionError naming the first difference between two runs and its likely cause."""
        differences = [*first_logged_difference(expected, got), *first_state_difference(expected, got)]
        if not differences:
            return
        notices = [line for line in (got.parent / f"{got.name}.log").read_text().splitlines() if "notice:" in line]
        said = f"; the engine said: {notices[0].split('notice: ', 1)[1]}" if notices else ""
        what = {"repeat": "two runs with the same settings differ", "resume": f"a run {how} differs from the "
                "uninterrupted run", "workers": "0 and 2 loader workers train different bits"}[check]  # fmt: skip
        raise AssertionError(f"{what}: {'; '.join(differences)}. Likely cause: {CAUSES[check]}{said}")


def logged_losses(run_dir: Path) -> dict[int, float]:
    with (run_dir / "metrics.csv").open(newline="") as file:
        return {int(float(row["step"])): float(row["train/loss"]) for row in csv.DictReader(file) if row["train/loss"]}


def first_logged_difference(expected: Path, got: Path) -> list[str]:
    ours, theirs = logged_losses(expected), logged_losses(got)
    for step in sorted(ours.keys() | theirs.keys()):
        if ours.get(step) != theirs.get(step):
            return [f"train/loss at step {step} is {theirs.get(step)} instead of {ours.get(step)}"]
    return []


def first_state_difference(expected: Path, got: Path) -> list[str]:
    ours = torch.load(expected / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    theirs = torch.load(got / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    for key in COMPARED:
        difference = first_difference(ours.get(key), theirs.get(key), key)
        if difference:
            return [f"the final checkpoint's {difference}"]
    return []


def first_difference(a, b, where: str) -> str | None:
    """Where `a` and `b` first differ, bit for bit, or None."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b):
            return None
        gap = (a.double() - b.double()).abs().max().item() if a.shape == b.shape and a.is_floating_point() else None
        return f"{where} differs" + (f" (by up to {gap:.3g})" if gap is not None else "")
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a.keys() | b.keys():
            found = first_difference(a.get(key), b.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        found = (first_difference(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True)))
        return next((f for f in found if f), None)
    return None if a == b else f"{where} is {b!r} instead of {a!r}"
