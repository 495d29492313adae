"""Running the project's command line in the tests: in this process (`cli`), or as `python -m template_package` in a
process of its own started warm (`WarmProcess`, `cli_subprocess`), on the tests' own stand-in task; and reading what a
run logged (`scalars`).

The engine's tests read the tests' own default config, helpers/config.yaml (the stand-in task of helpers/stand_in.py),
never the project's configs/default.yaml, which names your classes and settings: conftest.py points the engine's
ENGINE_DEFAULT_CONFIG at it for this process and every process a test starts. The example's tests and the guarantee
kit's test read configs/default.yaml (conftest.py)."""

import atexit
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from template_package.engine.cli.main import main

from helpers.warm_start import WarmStart, dump_stacks, warm_server

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
TESTS_CONFIG = Path(__file__).resolve().parent / "config.yaml"  # the engine's tests' default config
# Enough to exercise every hook in a couple of seconds: 2 epochs of 6 batches.
QUICK = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=6", "--trainer.enable_progress_bar=false"]
# The stand-in task (helpers/stand_in.py), given right after the subcommand, with the metric it logs as the monitored
# one: what helpers/config.yaml names, and a command's own classes for the tests that read another config.
STAND_IN = ["--model=helpers.stand_in.StandInClassifier", "--data=helpers.stand_in.StandInData",
            "--checkpoint.monitor=val/acc", "--checkpoint.mode=max"]  # fmt: skip
TRAINER_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def with_task(args: tuple[str, ...] | list[str], task: list[str]) -> list[str]:
    """`args` with the task's class options right after a Trainer subcommand."""
    args = list(args)
    return [args[0], *task, *args[1:]] if args[:1] and args[0] in TRAINER_SUBCOMMANDS else args


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment for a `python -m template_package` child: the project's src/ and tests/ (for the
    tests' own callbacks and plugins) put before the caller's PYTHONPATH, which is kept. Without pytest's name of
    the current test, so that the guarantee kits of one test process, keyed by their environment, share a warm
    server."""
    paths = [str(PROJECT_ROOT / "src"), str(TESTS), os.environ.get("PYTHONPATH", "")]
    env = {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **extra}


# Processes a test started in a session of their own (see started()); whatever is left of them when the test ends,
# passed or failed (a run frozen at a kill point, say), is SIGKILLed with its whole process group.
STARTED: list = []  # (conftest.stop_what_the_test_started ends them)


def started(process):
    STARTED.append(process)
    return process


def cli(*args: str, task: list[str] = STAND_IN):
    """`python -m template_package ARGS`, in this process, on the stand-in task (task=[]: the config's classes);
    returns the LightningCLI."""
    return main(with_task(args, task))


_WARM: list[WarmStart] = []  # this test process's warm server, started at its first child (the kits' too)


class WarmProcess:
    """`python -m template_package ARGS` in a child process, in the current folder, used as a subprocess.Popen: started
    from the tests' warm server (helpers/warm_start.py), it skips the 5-10 s of imports a fresh interpreter pays, and
    is otherwise a process of its own, leading a session of its own."""

    def __init__(self, args: list[str], cwd: Path | None = None) -> None:
        if not _WARM:
            _WARM.append(warm_server(subprocess_env(), Path.cwd()))
        self.args, self.returncode = list(args), None
        self._output = Path(tempfile.mkdtemp(prefix="warm-"))
        atexit.register(shutil.rmtree, self._output, ignore_errors=True)
        out, err = self._output / "out", self._output / "err"
        self.pid = _WARM[0].start(self.args, cwd or Path.cwd(), out, err, env=subprocess_env())  # the test's whole env

    def poll(self) -> int | None:
        return self.wait(timeout=0, check=False)

    def wait(self, timeout: float | None = None, check: bool = True) -> int | None:
        self.returncode = _WARM[0].returncode(self.pid, timeout)
        if self.returncode is None and check:
            stacks = self.stacks()
            raise subprocess.TimeoutExpired(self.args, timeout, stderr=stacks) from AssertionError(
                f"still running after {timeout} s, its threads' stacks at the end of its standard error:\n{stacks}"
            )
        return self.returncode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def stacks(self) -> str:
        """Its standard error's tail, ending with every thread's stack of it and its process group, printed now."""
        return dump_stacks(self.pid, self._output / "err")

    def output(self) -> tuple[str, str]:
        """What it has written so far to its standard output and error."""
        files = [self._output / name for name in ("out", "err")]
        return tuple(f.read_text() if f.exists() else "(none: the child ended before opening it)" for f in files)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        output = self.output()
        shutil.rmtree(self._output, ignore_errors=True)
        return output


def cli_subprocess(*args: str, timeout: float = 300, task: list[str] = STAND_IN) -> subprocess.CompletedProcess:
    """`python -m template_package ARGS` in a child process, in the test's folder, on the stand-in task."""
    process = started(WarmProcess(with_task(args, task)))
    out, err = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def resume(run_dir: Path, *args: str, task: list[str] = STAND_IN):
    """`fit --ckpt_path last` in this process, in a later second than the run's newest TensorBoard event file:
    TensorBoard reads a run's event files in the order of their names (the second, host, PID, then a per-process
    counter that sorts as text), and a file named in the same second could sort before it."""
    named = [int(path.name.split(".")[3]) for path in Path(run_dir).rglob("events.out.tfevents.*")]
    time.sleep(max(0.0, max(named, default=0) + 1 - time.time()))
    return cli("fit", f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last", *args, task=task)


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar TensorBoard holds for the run, as {tag: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def extra_config(path: Path, callbacks: list[dict] = (), plugins: list[dict] = (), loggers: list[dict] = ()) -> str:
    """Write a `--config` file that adds callbacks, loggers and Trainer plugins ({"class_path", "init_args"}) to a
    run; returns its path."""
    trainer = {}
    if callbacks:
        trainer["callbacks+"] = list(callbacks)
    if loggers:
        trainer["logger+"] = list(loggers)
    if plugins:
        trainer["plugins"] = list(plugins)
    path.write_text(yaml.safe_dump({"trainer": trainer}))
    return str(path)
