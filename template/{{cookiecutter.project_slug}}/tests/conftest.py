"""Shared helpers: run the real CLI in-process with a tiny budget, or as `python -m` in a subprocess.

The engine's tests (tests/*.py) train the stand-in task of stand_in.py, whatever configs/default.yaml names; the tests
of the example task live in a folder of their own (tests/<task>/) and are marked `example`: after you replace the
example with your own model and data, `pytest -m "not example"` checks the engine and `pytest -m guarantees` your
classes."""

import os

# One thread per process (this one and every process a test starts): pytest-xdist runs a test file per CPU, and a
# test's training processes each took all the CPUs, so that the suite ran slower in parallel than in series.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import atexit
import contextlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from helpers.warm_start import WarmStart, dump_stacks, warm_server

from template_package.engine.cli.main import main

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# Enough to exercise every hook in a couple of seconds: 2 epochs of 6 batches.
QUICK = ["--trainer.max_epochs=2", "--trainer.limit_train_batches=6", "--trainer.enable_progress_bar=false"]
# The engine's tests train the stand-in task (stand_in.py), given right after the subcommand, with the metric it logs
# as the monitored one, whatever configs/default.yaml names for your own task (each class from its own defaults).
STAND_IN = ["--model=stand_in.StandInClassifier", "--data=stand_in.StandInData", "--checkpoint.monitor=val/acc",
            "--checkpoint.mode=max"]  # fmt: skip
TRAINER_SUBCOMMANDS = ("fit", "validate", "test", "predict")


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: a worker per CPU and one more. The extra worker fills the time the tests spend waiting (for the
    processes they start and kill, for signals, servers and SLURM); more workers than that slow every process down
    more than they fill (docs/decisions.md)."""
    return (os.cpu_count() or 1) + 1


def pytest_collection_modifyitems(items) -> None:
    """Tests in a folder of tests/ test the example task: marked `example`. (The files run in pytest-xdist's order, the
    files with the most tests first: the longest files first put the heaviest at once on the CPUs, which cost more time
    in all, docs/decisions.md.)"""
    for item in items:
        if Path(item.path).parent != TESTS:
            item.add_marker(pytest.mark.example)


def with_task(args: tuple[str, ...] | list[str], task: list[str]) -> list[str]:
    """`args` with the task's class options right after a Trainer subcommand."""
    args = list(args)
    return [args[0], *task, *args[1:]] if args[:1] and args[0] in TRAINER_SUBCOMMANDS else args


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture(autouse=True)
def work_in_a_folder_of_the_tests_own(tmp_path: Path, monkeypatch) -> None:
    """Every test runs in its own temporary folder: a path left relative (a default `runs/...`, a preset's SQLite
    file) lands there, never in the project being tested."""
    monkeypatch.chdir(tmp_path)


# What the tests must leave as they found it in the project (pytest_sessionfinish checks).
PROJECT_OUTPUTS = ("runs", "lightning_logs", "mlruns")


def fingerprint(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime) of every file under the project's output folders."""
    files = [path for name in PROJECT_OUTPUTS for path in (root / name).rglob("*") if path.is_file()]
    return {str(path): (path.stat().st_size, path.stat().st_mtime_ns) for path in files}


def pytest_sessionstart(session) -> None:
    session.config.project_outputs = fingerprint(PROJECT_ROOT)


def pytest_sessionfinish(session, exitstatus) -> None:
    """A test must never write into the project it tests: the suite fails when runs/ (or another output folder of
    the project) changed while it ran. (Checked once, in the main process, not in each xdist worker.)"""
    if hasattr(session.config, "workerinput"):
        return
    before, after = session.config.project_outputs, fingerprint(PROJECT_ROOT)
    changed = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    if changed:
        print(f"\nerror: the tests wrote into the project: {', '.join(changed[:5])}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
STARTED: list = []


def started(process):
    STARTED.append(process)
    return process


@pytest.fixture(autouse=True)
def stop_what_the_test_started():
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


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


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A 24 MiB tmpfs mounted for this test (root only), unmounted after it."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to fill up: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)
