"""`sweep --sweep.storage postgresql+psycopg://...`: processes on several machines share one study through a real
PostgreSQL server, each with a `--sweep.dir` of its own (no shared filesystem): each trial is trained once; a machine
killed mid-trial is found out through the database and its trial finished by another, its `fit` dying with it; best.yaml
is written wherever the results are shown; and a server that cannot be reached costs one line."""

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from helpers.cli import cli
from helpers.sweeps import finish_sweep, start_sweep, sweep_command

optuna = pytest.importorskip("optuna", reason='sweeps need the sweep extra: pip install -e ".[sweep]"')
psycopg = pytest.importorskip("psycopg", reason='a PostgreSQL study needs the sweep extra: pip install -e ".[sweep]"')

# A trial silent for 4 s lost its process: a sign of life every 2 s (the default is a minute), with room for a loaded
# machine to be late.
HEARTBEAT = "--sweep.heartbeat=2"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def postgres_programs() -> tuple[str, str]:
    """initdb and postgres: on PATH, or where Debian's `postgresql` package puts them."""
    for folder in [None, *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]:
        initdb, server = shutil.which("initdb", path=folder), shutil.which("postgres", path=folder)
        if initdb and server:
            return initdb, server
    pytest.skip("no PostgreSQL server here (initdb, postgres): apt-get install postgresql")


@pytest.fixture(scope="module")
def postgres() -> str:
    """A PostgreSQL server of this module's own on 127.0.0.1, stopped by its PID at the end; returns the URL of its
    `postgres` database. initdb and the server refuse to run as root: as root they run as the `postgres` user."""
    initdb, server = postgres_programs()
    user = {}
    if os.geteuid() == 0:
        try:
            user = {"user": "postgres", "group": pwd.getpwnam("postgres").pw_gid, "extra_groups": []}
        except KeyError:
            pytest.skip("PostgreSQL refuses to run as root and there is no `postgres` user to run it as")
    folder = Path(tempfile.mkdtemp(prefix="sweep-postgres-"))  # pytest's folders are closed to other users
    if user:
        shutil.chown(folder, "postgres")
    port = free_port()
    with (folder / "server.log").open("w") as log:
        subprocess.run([initdb, "-D", str(folder / "data"), "-A", "trust", "-U", "postgres", "--no-sync"], check=True,
                       stdout=log, stderr=subprocess.STDOUT, cwd=folder, **user)  # fmt: skip
        process = subprocess.Popen(
            [server, "-D", str(folder / "data"), "-k", str(folder), "-h", "127.0.0.1", "-p", str(port),
             "-c", "fsync=off", "-c", "max_connections=200"],
            stdout=log, stderr=subprocess.STDOUT, cwd=folder, **user,
        )  # fmt: skip
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        while True:  # until it accepts connections, or has died saying why
            with contextlib.suppress(psycopg.OperationalError), psycopg.connect(url, connect_timeout=5):
                break
            assert process.poll() is None, (folder / "server.log").read_text()[-2000:]
            time.sleep(0.1)
        yield url
    finally:
        process.send_signal(signal.SIGQUIT)  # an immediate shutdown: the server and its data are thrown away
        process.wait(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def new_database(server_url: str, name: str) -> str:
    """A new database on the server; returns the study URL for it."""
    with psycopg.connect(server_url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return server_url.replace("postgresql://", "postgresql+psycopg://").rsplit("/", 1)[0] + f"/{name}"


def finished_trials(url: str) -> list[tuple]:
    """What makes a study, as test_sweep's study_of reads it, without FAIL trials (a retry's first attempt) and with
    the others numbered again in order."""
    study = optuna.load_study(study_name="sweep", storage=url)
    trials = [t for t in study.trials if t.state.name != "FAIL"]
    return [(n, t.params, t.value, t.state.name, t.intermediate_values) for n, t in enumerate(trials)]


def trained_where(machines: list[Path], number: int) -> list[str]:
    """The fit logs of trial `number` on each machine, as the machine's name, once per run that started from scratch."""
    runs = []
    for machine in machines:
        log = machine / f"trial-{number}" / "fit.log"
        if log.exists():
            runs += [machine.name] * log.read_text().count("starting a fresh run")
    return runs


@contextlib.contextmanager
def stopped_at_the_end(processes: list):
    """SIGKILL what is left of the processes when the block ends: each leads a process group of its own, which its fit
    joins and outlives when it survives its sweep (that is a failure to see, not to leave running). A module's fixture
    ends its processes itself: conftest.py's function-scoped fixture would come after it."""
    try:
        yield processes
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def two_machines(postgres, tmp_path_factory) -> tuple[str, list[Path], list[str]]:
    """Two sweeps on one study, each with its own --sweep.dir as two machines without a shared filesystem would;
    returns the study URL, their folders and what they printed."""
    url = new_database(postgres, "two_machines")
    root = tmp_path_factory.mktemp("machines")
    machines = [root / "a", root / "b"]
    with stopped_at_the_end([start_sweep(m, 2, f"--sweep.storage={url}", HEARTBEAT) for m in machines]) as processes:
        return url, machines, [finish_sweep(process) for process in processes]


@pytest.mark.slow
def test_two_machines_share_one_study_and_train_each_trial_once(two_machines):
    url, machines, outs = two_machines
    trials = finished_trials(url)
    assert [number for number, *_ in trials] == [0, 1]
    assert all(state in ("COMPLETE", "PRUNED") for *_, state, _ in trials)
    for number in range(2):
        assert len(trained_where(machines, number)) == 1, trained_where(machines, number)
    # best.yaml is written by each, wherever the best trial ran: its config is kept in the study.
    best = max((t for t in trials if t[3] == "COMPLETE"), key=lambda t: t[2])
    for machine, out in zip(machines, outs, strict=True):
        assert f"best: trial {best[0]}" in out
        config = yaml.safe_load((machine / "best.yaml").read_text())
        assert config["model"]["init_args"]["lr"] == best[1]["model.lr"]


def fit_of(machine: Path) -> tuple[int, int]:
    """The trial a sweep trains once it has a checkpoint, and the PID of its fit (from the fit's run lock)."""
    for lock in machine.glob("trial-*/.lock"):
        if (lock.parent / "checkpoints" / "last.ckpt").exists() and lock.read_text().strip():
            return int(lock.parent.name.removeprefix("trial-")), int(lock.read_text().split()[-1])
    return -1, -1


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


# With a shared --sweep.dir on one machine, b would take the trial over as soon as a's trial lock is free, from a's
# last.ckpt (`b = a` below; measured, 30 s more for the suite): the file locks work as with SQLite.
SHARED_DIR = False


@pytest.mark.slow
def test_a_machine_killed_mid_trial_is_taken_over_and_the_study_ends_as_if_it_had_not_been(
    two_machines, postgres, tmp_path
):
    """Two sweeps with folders of their own on a study of one trial (lean: the trial is what matters). Once a's trial
    has a checkpoint, its fit is frozen and b waits for the trial; then a is SIGKILLed for good (the sweep process
    alone: its fit, continued, ends as soon as it sees its sweep gone), and b finishes the study alone: it takes a's
    trial over once a's heartbeat is stale, from the start. The study equals the uninterrupted one of `two_machines`
    (its first trial: the same command draws the same trials)."""
    url = new_database(postgres, "killed")
    a, b = tmp_path / "a", tmp_path / ("a" if SHARED_DIR else "b")
    with stopped_at_the_end([start_sweep(a, 1, f"--sweep.storage={url}", HEARTBEAT)]) as processes:
        while not list(a.glob("trial-*")):  # a has the trial: b starts, and waits
            assert processes[0].poll() is None, processes[0].communicate()[1][-3000:]
            time.sleep(0.02)
        processes.append(start_sweep(b, 1, f"--sweep.storage={url}", HEARTBEAT))
        while (killed := fit_of(a))[0] < 0:
            assert processes[0].poll() is None, processes[0].communicate()[1][-3000:]
            time.sleep(0.02)
        number, fit_pid = killed
        os.kill(fit_pid, signal.SIGSTOP)  # a's trial frozen mid-way (a's sweep lives on): it cannot end on its own
        while "\nwaiting for trial(s) 0, running elsewhere" not in "\n" + processes[1].output()[0]:
            assert processes[1].poll() is None, processes[1].communicate()[1][-3000:]  # b waits: trial 0 is a's
            time.sleep(0.02)
        os.kill(processes[0].pid, signal.SIGKILL)
        processes[0].wait()
        os.kill(fit_pid, signal.SIGCONT)  # running again, it sees its sweep is gone and ends (cli/exit_with_parent.py)
        deadline = time.monotonic() + 30
        while alive(fit_pid):
            assert time.monotonic() < deadline, f"the fit {fit_pid} of the killed sweep lives on"
            time.sleep(0.05)
        out = finish_sweep(processes[1])
    assert finished_trials(url) == finished_trials(two_machines[0])[:1]
    row = next(line for line in out.splitlines() if line.startswith(f"{number} "))  # the table of the trials
    assert str(b / f"trial-{number}") in row  # where the trial was finished
    taken_over = f"trial {number} lost its process: taken over, from {'its last.ckpt' if SHARED_DIR else 'the start'}"
    assert taken_over in out
    log = (b / f"trial-{number}" / "fit.log").read_text()
    assert log.count("starting a fresh run") == 1
    assert ("Restoring states from the checkpoint path" in log) == SHARED_DIR


def test_a_database_server_that_cannot_be_reached_costs_one_line(tmp_path):
    url = f"postgresql+psycopg://someone@127.0.0.1:{free_port()}/studies"  # nothing listens there
    with pytest.raises(SystemExit) as stop:
        cli(*sweep_command(tmp_path / "sweep", 2, f"--sweep.storage={url}"))
    message = str(stop.value.code)
    assert message.startswith("error: cannot reach the study's database studies on 127.0.0.1:"), message
    assert message.endswith("start the server, create the database, or correct --sweep.storage"), message
    assert "\n" not in message and "sqlalchemy" not in message.lower()
