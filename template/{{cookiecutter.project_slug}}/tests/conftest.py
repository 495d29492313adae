"""The suite's settings and fixtures; the helpers the tests import are in tests/helpers/.

The engine's tests (tests/test_*.py) train the stand-in task of helpers/stand_in.py and read the tests' own default
config (helpers/config.yaml), never configs/default.yaml, which names your classes and settings; the tests of the
example task live in a folder of their own (tests/<task>/) and are marked `example`, and they and the guarantee kit
(`guarantees`) read configs/default.yaml. After you replace the example with your own model and data and delete its
tests, `pytest` checks the engine, and `pytest -m guarantees` your classes."""

import os

# One thread per process (this one and every process a test starts): pytest-xdist runs a test file per CPU, and a
# test's training processes each took all the CPUs, so that the suite ran slower in parallel than in series.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from template_package.engine.cli.main import DEFAULT_CONFIG_VARIABLE

from helpers.cli import STARTED, TESTS_CONFIG

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
# The engine's tests read the tests' default config, in this process and in every process a test starts.
os.environ[DEFAULT_CONFIG_VARIABLE] = str(TESTS_CONFIG)


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


@pytest.fixture(autouse=True)
def the_project_config_for_the_example_and_the_kit(request, monkeypatch) -> None:
    """The example's tests and the guarantee kit's test read the project's own configs/default.yaml."""
    if request.node.get_closest_marker("example") or request.node.get_closest_marker("guarantees"):
        monkeypatch.delenv(DEFAULT_CONFIG_VARIABLE)


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


@pytest.fixture(autouse=True)
def stop_what_the_test_started():
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


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
