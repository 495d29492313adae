"""The guarantee kit: do your model and data get every guarantee of the engine? `pytest -m guarantees` runs it on the
classes configs/default.yaml names (tests/test_guarantees.py), and `python -m <package> guarantees [--model a.b.C
--data a.b.D ...]` on any classes, wherever the engine was copied.

Each check trains short real runs in child processes (`python -m <package> fit`, as your runs start; two at once
where they do not depend on each other), in the working directory the kit was made in (your relative paths mean what
they mean in your runs), with these settings overridden: the CPU, one process, 32-true precision, 2 epochs of at
most 6 batches, 2 validation batches, every metric written to metrics.csv every 2 steps (a window that a checkpoint
cuts, so that state a module keeps between two logged steps is resumed or shown). Everything else is your config's.
A DataModule that reads a stream makes its data small itself, with the init arguments of its class attribute
`kit_options` (e.g. `kit_options = {"shard_sizes": [24, 24, 24, 24]}`): the kit's runs then read it as a real run
does, where a limit of 6 batches would give the loader a length and switch off Lightning's read-ahead; they get
`max_steps=1000` too, the length a warmup-cosine schedule needs from a stream (the runs still end after 2 epochs).

- repeatable: two runs with the same settings end with the same bits;
- exact resume: one run stopped three times and resumed each time with `--ckpt_path last`, at the three kinds of
  moment a scheduler or a crash picks: SIGKILL right after the first epoch's end was saved, SIGKILL mid-epoch after a
  checkpoint, SIGTERM during the last validation (the engine saves at once; the resumed run validates again). It
  must end with the uninterrupted run's weights, optimizer and schedule states, generators, and every metric logged
  (whatever their names), bit for bit. When it does not, each stop is tried alone, to say which one breaks it;
- workers: 0 and 2 loader workers train the same bits (when the DataModule takes `num_workers`, and not for a stream:
  each worker builds batches of its own part of it, so the number of workers is part of its order).

Before any of them, the kit checks what `fit` checks before it trains (check_configuration): a mistake in the options,
a class that cannot be imported or built, a monitored metric the model does not log, is fit's own one line, and no
check runs. A failure is one message naming the first tensor or metric that differs and the likely cause for the stop
that showed it (the module's own attributes of plain Python values that its hooks changed, a list it appends to, say,
by name); a run of the kit's that cannot train at all is said as such, with its error.
Depends on torch, lightning and the engine's command line.
"""

import argparse
import csv
import inspect
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import lightning as L
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from .cli.help import program
from .data.streams import saved_stream
from .errors import UsageError
from .resume.exact_resume import ExactResume
from .resume.whole_checkpoint import read_whole
from .training.steps import steps_in, training_steps

ENGINE = __package__  # the class paths of the kit's own callbacks and logger
SETTINGS = [
    "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.num_nodes=1", "--trainer.strategy=auto",
    "--trainer.precision=32-true", "--trainer.max_epochs=2", "--trainer.max_steps=-1",
    "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=2",
    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
]  # fmt: skip
SHORT_EPOCHS = "--trainer.limit_train_batches=6"  # for data without `kit_options`
STREAM_LENGTH = "--trainer.max_steps=1000"  # for data with them: a schedule's length (2 epochs end the runs first)
# What the final checkpoints must hold alike (EMA's weights and the trained ones too).
COMPARED = ("trained_state", "state_dict", "optimizer_states", "lr_schedulers", "global_step", "epoch",
            "training_steps", "rng_states", "current_model_state", "averaging_state")  # fmt: skip
STATE = (
    "a random generator the dataset or model keeps for itself (draw from torch's, random's or numpy's global "
    "generators instead, which the engine seeds for each sample, or from np.random.default_rng(sample_seed())), "
    "a train loader that cannot resume (see the engine's notice), or state of the module or of a callback of yours "
    "that the checkpoint does not hold (an attribute a hook changes: keep it in a registered buffer, or in "
    "on_save_checkpoint/on_load_checkpoint)"
)
CAUSES = {
    "repeat": "randomness that no seed reaches: a generator created without a seed (np.random.default_rng(), "
    "random.Random(), torch.Generator() without manual_seed) or seeded from the time or os.urandom, or a kernel that "
    "is not deterministic",
    "mid_epoch": f"state the checkpoint does not hold: {STATE}",
    "epoch_end": "state changed at an epoch's end or start that the checkpoint does not hold: an attribute (not a "
    "buffer or a parameter) that on_train_epoch_end or on_train_epoch_start changes, or a callback of yours whose "
    "state_dict/load_state_dict does not keep what its epoch hooks change",
    "validation": "state that validation changes and the engine cannot put back: the model changed for validation by "
    "a hook or a callback of yours and changed back at its end (swapped weights, say), or a generator a validation "
    "hook draws from that the checkpoint does not hold",
    "several": f"state lost only when a run is stopped more than once: {STATE}",
    "workers": "random draws in loader workers from a generator the dataset keeps, or from each worker's own seed: "
    "draw from torch's, random's or numpy's global generators (seeded per sample) or from sample_seed()",
}
# What set training up differently (resume/trained_state.py), named before the generic causes.
TRAINED_STATE_CAUSES = {
    "requires_grad": "parameters frozen in one run and trainable in the other (a callback that freezes or unfreezes "
    "them in a hook the resumed run does not repeat)",
    "param_groups": "a param group's settings or members (an LR, a weight decay, parameters added to it) set "
    "differently by a hook on a restart",
    "track_running_stats": "BatchNorm's running statistics switched on or off by a callback (BaseFinetuning's "
    "train_bn=False)",
    "modes": "a submodule in train mode in one run and eval mode in the other (set by a hook)",
}
# For a stream (engine/data/streams.py), what breaks a resume from a checkpoint of each kind, before the rest.
STREAM_ORDER = (
    "an epoch of the stream whose order does not repeat (its set_epoch must make the order a function of the seed "
    "and the epoch alone, its state_dict hold whatever the order depends on)"
)
STREAM_CAUSES = {
    "mid_epoch": "a position of the stream ahead of the weights (a loader state saved after Lightning had read a "
    f"batch ahead: the resumed run skips a batch), {STREAM_ORDER}",
    "epoch_end": STREAM_ORDER,
    "several": f"a position of the stream ahead of the weights, {STREAM_ORDER}",
}
STOPS = {  # the kill points, in the order the resumed run meets them (each resumes from a checkpoint of its own kind)
    "epoch_end": "SIGKILLed right after its first epoch's end was saved",
    "mid_epoch": "SIGKILLed mid-epoch after a checkpoint",
    "validation": "stopped by SIGTERM during its last validation",
}


class KitRunFailed(AssertionError):
    """A run of the kit's ended with an error of its own: no guarantee was checked (a bug in the model or the data
    that a short run meets, say)."""


class KitConfigurationError(UsageError):
    """A mistake in what the kit was given, found before any of its runs: the one line that `fit` says for it."""


class StopAt(Callback):
    """Sends `signal_name` to this process once the training steps reach `step`, at the end of a training batch or
    (`in_validation`) of a validation batch, once per `marker` file (a resumed run goes on): SIGKILL is a crash or the
    out-of-memory killer, SIGTERM a scheduler's preemption. A write of last.ckpt in flight finishes first, so that the
    run resumes from the checkpoint the stop is meant for (a kill during a write is tested on its own)."""

    def __init__(self, marker: str, step: int, signal_name: str = "SIGKILL", in_validation: bool = False) -> None:
        self.marker, self.step, self.in_validation = Path(marker), step, in_validation
        self.signum = getattr(signal, signal_name)
        self.at_start: dict[str, str] = {}
        self.changed: set[str] = set()  # the module's plain attributes its hooks changed (plain_attributes)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.at_start = plain_attributes(pl_module)

    def _stop(self, trainer: L.Trainer) -> None:
        if training_steps(trainer) >= self.step and not self.marker.exists():
            for callback in trainer.callbacks:
                if isinstance(callback, ExactResume):
                    callback._wait_for_write()
            self.marker.write_text(json.dumps({"steps": training_steps(trainer), "changed": sorted(self.changed)}))
            os.kill(os.getpid(), self.signum)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        now = plain_attributes(pl_module)
        self.changed |= {name for name, value in now.items() if self.at_start.get(name) != value}
        if not self.in_validation:
            self._stop(trainer)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.in_validation and not trainer.sanity_checking:
            self._stop(trainer)


def plain_attributes(module: L.LightningModule) -> dict[str, str]:
    """The module's own attributes that hold plain Python values (a list a hook appends to, a counter), each as its
    repr: state that no checkpoint holds."""
    lightnings = set(vars(L.LightningModule()))
    return {name: repr(value)[:1000] for name, value in vars(module).items()
            if name not in lightnings and isinstance(value, list | dict | set | tuple | int | float)}  # fmt: skip


class GuaranteeKit:
    """Runs the checks on the model and data that `task` selects (e.g. ["--model=a.b.C"]; [] for the config's own),
    in `folder`, from the working directory `cwd` (the current one by default), with the child processes'
    environment `env`."""

    def __init__(
        self,
        folder: Path,
        task: list[str] = (),
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        run: Callable[[list[str], Path, dict[str, str]], subprocess.CompletedProcess] | None = None,
    ) -> None:
        """`run(args, cwd, env)` runs `python -m <package> ARGS` and returns what it did, called from two threads at
        once; by default a new process, as your runs start (run_command)."""
        self.folder, self.task = Path(folder).resolve(), list(task)
        self.cwd = Path(cwd or Path.cwd()).resolve()
        self.env = {"OMP_NUM_THREADS": "1", **(env or os.environ)}
        if self.env.get("PYTHONPATH"):  # its folders as a new interpreter in cwd reads them, wherever the server is
            folders = self.env["PYTHONPATH"].split(os.pathsep)
            self.env["PYTHONPATH"] = os.pathsep.join(str(self.cwd / folder) for folder in folders)  # ("": cwd)
        self.run = run or run_command
        self._reference: Path | None = None
        self._data_settings: list[str] | None = None
        self._csv_logger: str | None = None
        self._resolved: dict | None = None

    def check_configuration(self) -> None:
        """What `fit` checks before it trains, before any run of the checks: the options and the classes parse
        (`fit --print_config`), then a fit that builds the model and the data and validates one batch, the sanity
        check's, where a monitored metric the model does not log stops it (training/monitor.py), and trains none.
        A mistake raises KitConfigurationError with fit's own line; anything else KitRunFailed, with its output."""
        self.config()
        tried = self._run(self.folder / "configuration", "--trainer.limit_train_batches=0",
                          "--trainer.num_sanity_val_steps=1", check=False)  # fmt: skip
        if tried.returncode != 0:
            raise mistake_or_failure(self.folder / "configuration", tried)

    # --- The checks ---------------------------------------------------------------------------------------------

    def check_repeatable(self) -> None:
        self.data_settings(), self.logger_config()  # (made once, before two runs read them)
        with ThreadPoolExecutor(2) as pool:  # (the two runs at once: on two cores the kit takes less time)
            repeat = pool.submit(self.fit, "repeat")
            reference = self.reference()
        self.compare("repeat", reference, repeat.result(), "two runs with the same settings differ")

    def check_exact_resume(self) -> None:
        """All three stops in one run, resumed after each; when that run differs, each stop alone, to name it: the
        mid-epoch one first, which any state the checkpoint lacks breaks, then those at an epoch's end and in
        validation, which only state of their own moment breaks."""
        plan = self.stop_plan()
        run_dir = self.stopped_run("resumed", plan)
        if not differences(self.reference(), run_dir):
            return
        for stop in ("mid_epoch", "epoch_end", "validation"):
            alone = self.stopped_run(f"resumed-{stop}", {stop: plan[stop]})
            self.compare(stop, self.reference(), alone, f"a run {STOPS[stop]} (after {plan[stop][0]} training steps) "
                         "and resumed differs from the uninterrupted run")  # fmt: skip
        said = ", then ".join(f"{STOPS[stop]} (after {step} training steps)" for stop, (step, _) in plan.items())
        self.compare("several", self.reference(), run_dir, f"a run {said}, resumed after each, differs from the "
                     "uninterrupted run (each stop alone does not)")  # fmt: skip

    def check_workers_agree(self) -> None:
        self.data_settings(), self.logger_config()
        with ThreadPoolExecutor(2) as pool:
            workers = list(pool.map(lambda count: self.fit(f"workers{count}", f"--data.num_workers={count}"), (0, 2)))
        self.compare("workers", *workers, "0 and 2 loader workers train different bits")

    def why_workers_not_compared(self) -> str | None:
        """Why 0 and 2 loader workers are not compared for this data; None when they must train the same bits."""
        if not self.takes_num_workers():
            return "the configured DataModule takes no num_workers"
        if self.reads_a_stream():
            return (
                "the train loader reads a stream: each loader worker builds batches of its own part of it, so another "
                "number of workers trains other samples (a resume with another number is refused)"
            )
        return None

    def reads_a_stream(self) -> bool:
        """Whether the uninterrupted run's train loader read a stream the engine makes exact."""
        return reads_a_stream(self.reference())

    def takes_num_workers(self) -> bool:
        """Whether the configured DataModule has a `num_workers` argument."""
        from .cli.checks import import_class

        data = (self.config().get("data") or {}).get("class_path")
        return data is not None and "num_workers" in inspect.signature(import_class(data)).parameters

    # --- Stops --------------------------------------------------------------------------------------------------

    def stop_plan(self) -> dict[str, tuple[int, int]]:
        """Each stop's (training step, checkpoint cadence): with E steps an epoch, last.ckpt every d steps, d the
        largest divisor of E up to E / 2, so that the first epoch's end is saved and so is a step of the second
        epoch before the mid-epoch kill; the stop in validation comes last, so that its checkpoint does not stand in
        for the others'."""
        steps = steps_of(self.reference())
        per_epoch = steps // 2
        if per_epoch < 2:
            raise AssertionError(f"the kit's run trained {steps} steps in 2 epochs: it needs 2 or more an epoch")
        every = max(d for d in range(1, per_epoch // 2 + 1) if per_epoch % d == 0)
        return {
            "epoch_end": (per_epoch + 1, every),
            "mid_epoch": (per_epoch + every + 1, every),
            "validation": (2 * per_epoch, every),
        }

    def uncovered(self) -> list[str]:
        """What the kit's 2-epoch runs do not reach of an epoch-dependent callback in the config (a BaseFinetuning's
        unfreeze at another epoch than 1)."""
        lines = []
        for callback in (self.config().get("trainer") or {}).get("callbacks") or []:
            name, init_args = callback.get("class_path", "").rsplit(".", 1)[-1], callback.get("init_args") or {}
            unfreeze = init_args.get("unfreeze_backbone_at_epoch")
            if isinstance(unfreeze, int) and unfreeze != 1:
                lines.append(
                    f"{name} unfreezes at epoch {unfreeze}: the kit's 2-epoch runs stop before and after epoch 1's "
                    "start; give it unfreeze_backbone_at_epoch 1 (-c a preset) to check the unfreeze"
                )
        return lines

    def stopped_run(self, name: str, plan: dict[str, tuple[int, int]]) -> Path:
        """A run stopped at each point of `plan` in turn, resumed with --ckpt_path last after each."""
        run_dir, markers = self.folder / name, {stop: self.folder / f"{name}-{stop}.stopped" for stop in plan}
        stops = [{"class_path": f"{ENGINE}.guarantees.StopAt", "init_args": {
            "marker": str(markers[stop]), "step": step, "signal_name": "SIGTERM" if stop == "validation" else "SIGKILL",
            "in_validation": stop == "validation"}} for stop, (step, _) in plan.items()]  # fmt: skip
        config = self._config(f"{name}.yaml", callbacks=stops)
        every = f"--last_checkpoint.every_n_steps={next(iter(plan.values()))[1]}"
        for attempt in range(len(plan) + 1):
            last = attempt == len(plan)
            process = self._run(run_dir, "-c", config, every, *(["--ckpt_path=last"] if attempt else []), check=last)
            if last:
                break
            if process.returncode not in (0, -signal.SIGKILL, 128 + signal.SIGTERM):
                raise KitRunFailed(failed(run_dir, process))
            if process.returncode == 0:  # it ended before the remaining stops (a run without validation, say)
                break
        return run_dir

    # --- Runs ----------------------------------------------------------------------------------------------------

    def reference(self) -> Path:
        if self._reference is None:
            reference = self.fit("uninterrupted")
            if SHORT_EPOCHS in self.data_settings() and reads_a_stream(reference):
                raise AssertionError(
                    "the train loader reads a stream, and the kit's 6-batch epochs would give it a length, which "
                    "switches off Lightning's read-ahead: its runs would not resume as yours do. Give the DataModule "
                    "a small stream of its own for the kit: a class attribute kit_options with the init arguments "
                    'that make it, e.g. kit_options = {"shard_sizes": [24, 24, 24, 24]} (docs/data.md)'
                )
            self._reference = reference
        return self._reference

    def data_settings(self) -> list[str]:
        """The DataModule's `kit_options` as options (its data made small by itself) with a run length for schedules,
        or else 6-batch epochs."""
        if self._data_settings is None:
            from .cli.checks import import_class

            data = (self.config().get("data") or {}).get("class_path")
            options = getattr(import_class(data), "kit_options", None) if data is not None else None
            small = [f"--data.{name}={value if isinstance(value, str) else json.dumps(value)}"
                     for name, value in (options or {}).items()]  # fmt: skip
            self._data_settings = [*small, STREAM_LENGTH] if small else [SHORT_EPOCHS]
        return self._data_settings

    def logger_config(self) -> str:
        """The config file that gives the kit's runs their CSV logger."""
        if self._csv_logger is None:
            logger = {"class_path": f"{ENGINE}.report.loggers.RunCSVLogger"}
            self._csv_logger = self._config("csv.yaml", loggers=[logger])
        return self._csv_logger

    def fit(self, name: str, *args: str) -> Path:
        run_dir = self.folder / name
        self._run(run_dir, *args)
        return run_dir

    def config(self) -> dict:
        """The fit config the kit's runs get, as `fit --print_config` resolves it (once); a mistake in the options
        or classes raises KitConfigurationError."""
        if self._resolved is None:
            printed = self._command("fit", *self.task, *SETTINGS, "--print_config", check=False)
            if printed.returncode != 0:
                raise mistake_or_failure(None, printed)
            self._resolved = yaml.safe_load(printed.stdout)
        return self._resolved

    def _run(self, run_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = self._command("fit", *self.task, *SETTINGS, *self.data_settings(), "-c", self.logger_config(),
                               f"--trainer.default_root_dir={run_dir}", *args, check=False)  # fmt: skip
        with (run_dir.parent / f"{run_dir.name}.log").open("a") as log:
            log.write(result.stdout + result.stderr)
        if check and result.returncode != 0:
            raise KitRunFailed(failed(run_dir, result))
        return result

    def _command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`python -m <package> ARGS` in a process of its own (self.run)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        result = self.run(list(args), self.cwd, self.env)
        if check and result.returncode != 0:
            raise KitRunFailed(failed(None, result))
        return result

    def _config(self, name: str, callbacks: list[dict] = (), loggers: list[dict] = ()) -> str:
        trainer = {"callbacks+": list(callbacks)} if callbacks else {"logger": list(loggers)}
        path = self.folder / name
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"trainer": trainer}))
        return str(path)

    # --- Comparing -------------------------------------------------------------------------------------------------

    def compare(self, cause: str, expected: Path, got: Path, what: str) -> None:
        """Raise AssertionError naming the first difference between two runs and the likely cause."""
        found = differences(expected, got)
        if not found:
            return
        notices = [line for line in (got.parent / f"{got.name}.log").read_text().splitlines() if "notice:" in line]
        said = f"; the engine said: {notices[0].split('notice: ', 1)[1]}" if notices else ""
        likely = CAUSES[cause]
        changed = sorted({name for marker in self.folder.glob(f"{got.name}-*.stopped")
                          for name in json.loads(marker.read_text())["changed"]})  # fmt: skip
        if changed and cause in ("mid_epoch", "several"):
            likely = (f"the module's attribute{'s' if len(changed) > 1 else ''} {', '.join(changed)}, changed during "
                      "training and held by no checkpoint (accumulate in a torchmetrics Metric, or log with "
                      "self.log(..., on_epoch=True), which the engine resumes; or keep it in a registered buffer); "
                      f"or {likely}")  # fmt: skip
        if cause in STREAM_CAUSES and self.reads_a_stream():
            likely = f"{STREAM_CAUSES[cause]}; or {likely}"
        # (a group's LR that differs follows from another difference, a schedule's: not named as a cause of its own)
        trained = [key for key in TRAINED_STATE_CAUSES for line in found if f"trained_state.{key}" in line
                   and not re.search(r"\.(lr|initial_lr) is ", line)]  # fmt: skip
        if trained:
            likely = f"{TRAINED_STATE_CAUSES[trained[0]]}; or {likely}"
        raise AssertionError(f"{what}: {'; '.join(found)}. Likely cause: {likely}{said}")


def run_command(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m <engine> ARGS` in a new process leading a session of its own (a kill at the timeout reaches its
    loader workers too), as a run of yours starts."""
    with subprocess.Popen([sys.executable, "-m", ENGINE, *args], cwd=cwd, env=env, text=True, start_new_session=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:  # fmt: skip
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def failed(run_dir: Path | None, run: subprocess.CompletedProcess) -> str:
    """What a run of the kit's said when it failed: its error line first, then the end of its output."""
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    error = next((line for line in reversed(lines) if line.startswith("error:")), lines[-1] if lines else "")
    where = f" in {run_dir}" if run_dir is not None else ""
    return f"a run of the kit's{where} could not train (exit {run.returncode}): {error}\n{run.stderr[-3000:]}"


def mistake_or_failure(run_dir: Path | None, run: subprocess.CompletedProcess) -> KitRunFailed | KitConfigurationError:
    """What a failed run of the kit's raises: its own one-line error (`error: ...`, a mistake the CLI found) as a
    KitConfigurationError, anything else (a traceback) as KitRunFailed with its output."""
    said = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    return KitConfigurationError(said[-1].removeprefix("error: ")) if said else KitRunFailed(failed(run_dir, run))


def reads_a_stream(run_dir: Path) -> bool:
    """Whether a run's train loader read a stream the engine makes exact (data/streams.py)."""
    return saved_stream(read_whole(run_dir / "checkpoints" / "last.ckpt")) is not None


def steps_of(run_dir: Path) -> int:
    """The training steps of a run's final checkpoint (training/steps.py: batches that stepped)."""
    return steps_in(read_whole(run_dir / "checkpoints" / "last.ckpt"))


def differences(expected: Path, got: Path) -> list[str]:
    """The first logged metric and the first tensor of the final checkpoint that differ between two runs."""
    return [*first_logged_difference(expected, got), *first_state_difference(expected, got)]


def logged_metrics(run_dir: Path) -> dict[tuple[str, int], float]:
    """Every value the run logged, by (name, step), but the timings (perf/*); a row without a step is skipped."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return {}
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    return {(name, int(float(row["step"]))): float(value) for row in rows if row.get("step")
            for name, value in row.items() if name != "step" and value and not name.startswith("perf/")}  # fmt: skip


def first_logged_difference(expected: Path, got: Path) -> list[str]:
    ours, theirs = logged_metrics(expected), logged_metrics(got)
    for name, step in sorted(ours.keys() | theirs.keys(), key=lambda key: (key[1], key[0])):
        a, b = ours.get((name, step)), theirs.get((name, step))
        if a != b and not (a is not None and b is not None and math.isnan(a) and math.isnan(b)):
            what = "is missing" if b is None else "was not logged by the uninterrupted run" if a is None else None
            what = what or f"is {b} instead of {a}"
            return [f"{name} logged at step {step} (after {step + 1} training steps, as the stops count) {what}"]
    return []


def first_state_difference(expected: Path, got: Path) -> list[str]:
    ours = read_whole(expected / "checkpoints" / "last.ckpt")  # (checked against its digest: resume/digests.py)
    theirs = read_whole(got / "checkpoints" / "last.ckpt")
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
        for key in sorted(a.keys() | b.keys(), key=str):
            found = first_difference(a.get(key), b.get(key), f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        found = (first_difference(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True)))
        return next((f for f in found if f), None)
    return None if a == b else f"{where} is {b!r} instead of {a!r}"


def main(argv: list[str] | None = None) -> None:
    """`python -m <package> guarantees [--folder DIR] [fit options]`: the kit on the classes the config and the fit
    options name, from the current folder; runs every check and exits 1 if one failed."""
    parser = argparse.ArgumentParser(
        prog=f"{program()} guarantees", description=__doc__.split("\n\n")[0],
        epilog="Every other option is a fit option, given to every run of the kit: --model a.b.C --data a.b.D, "
        "--checkpoint.monitor val/loss, -c a preset.",
    )  # fmt: skip
    parser.add_argument("--folder", help="where the kit's runs go (default: a temporary folder, removed after)")
    args, task = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="guarantees-") as temporary:
        kit = GuaranteeKit(Path(args.folder or temporary), task)
        try:
            kit.check_configuration()
        except KitConfigurationError as mistake:  # (fit's own line, as fit says it)
            raise SystemExit(f"error: {mistake}") from None
        except KitRunFailed as failure:
            print(f"FAILED: {failure}", file=sys.stderr)
            raise SystemExit(1) from None
        checks = [("repeatable", kit.check_repeatable, None), ("exact resume", kit.check_exact_resume, None)]
        if kit.takes_num_workers():
            checks.append(("0 and 2 loader workers agree", kit.check_workers_agree, kit.why_workers_not_compared))
        for line in kit.uncovered():
            print(f"not covered: {line}")
        failed = False
        for name, check, why_not in checks:  # every check, even after one failed
            try:
                skipped = why_not() if why_not is not None else None  # (reads the uninterrupted run)
                if skipped:  # (a stream)
                    print(f"skipped: {name}: {skipped}")
                    continue
                check()
            except KitRunFailed as failure:
                print(f"FAILED: {failure}", file=sys.stderr)
                failed = True
            except AssertionError as failure:
                print(f"FAILED {name}: {failure}", file=sys.stderr)
                failed = True
            else:
                print(f"passed: {name}")
        if failed:
            raise SystemExit(1)
