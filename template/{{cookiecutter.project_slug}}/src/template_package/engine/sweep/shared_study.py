"""Where a sweep's study lives, and how its processes tell a trial that is being trained from one whose process died.

SQLite (the default, `sqlite:///DIR/study.db`): every process of the study runs on this machine with the same DIR. A
trial belongs to the process that holds `DIR/trial-<n>/.sweep.lock` (a flock, which the kernel drops when its holder
dies however it dies), and trials are claimed under `DIR/.sweep.lock`.

A database server (`postgresql+psycopg://USER@HOST:PORT/DB`): processes on several machines share the study, each
with a `--sweep.dir` of its own or one on a shared filesystem; nothing but the database needs to be shared.
- Trials are claimed under a PostgreSQL advisory lock on the study, which the server drops when the connection of
  its holder dies: no two processes ask for the last trial, or take over one trial, at once. (Other servers, MySQL
  say, claim under `DIR/.sweep.lock` and so need a DIR on a filesystem their processes share.)
- A trial belongs to the process that records its heartbeats in the database (Optuna's `record_heartbeat`, every
  `sweep.heartbeat` seconds, from the sweep process while the trial's `fit` runs). A trial silent for twice as long
  lost its process (SIGKILL, a machine gone) and is taken over by the next process that looks, under the same
  number: from its last.ckpt when its run directory is reachable (a shared DIR), from the start otherwise. So is one
  whose owner ran on this machine in this DIR and whose trial lock is free (the same command run again after a kill:
  at once, as with SQLite).
- Why not Optuna's `fail_stale_trials` with `RetryHeartbeatStaleTrialCallback`: the retry is a new trial under a new
  number, which needs another run directory name, loses the trial's intermediate values unless copied, and shifts
  the per-number seeds of the trials drawn after it. Taken over under its own number, a trial keeps all three, and
  the finished study equals the one an uninterrupted sweep makes.
Depends on Optuna (and SQLAlchemy, which it brings), and on psycopg for PostgreSQL.
"""

import contextlib
import socket
import threading
import time
import warnings
from pathlib import Path

import optuna
import sqlalchemy

from ..errors import UsageError
from ..internals import stale_trial_ids, study_storage, trial_id_of
from ..resume.run_lock import RunDirectoryBusy, RunLock

OWNER = "sweep_owner"  # a trial's system attribute: the host and DIR of the process that trains it
ADVISORY_KEY = 0x7377656570  # "sweep": the PostgreSQL advisory lock of the database's study


class StudyStorageError(UsageError):
    """The study's database cannot be opened; the message is the one line the user sees."""


def is_server(url: str) -> bool:
    return not url.startswith("sqlite")


def open_storage(url: str, heartbeat: int) -> optuna.storages.BaseStorage | str:
    """SQLite as a URL (Optuna caches it); a server as an RDBStorage that records heartbeats, `heartbeat` seconds
    apart, a trial silent for twice as long being stale."""
    if not is_server(url):
        return url
    with warnings.catch_warnings(), translated_errors(url):
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats: stable since Optuna 2.0
        return optuna.storages.RDBStorage(
            url, engine_kwargs=engine_options(url), heartbeat_interval=heartbeat, grace_period=2 * heartbeat
        )


def engine_options(url: str) -> dict:
    # An unreachable PostgreSQL host fails within connect_timeout, not after the operating system's TCP timeout.
    return {"connect_args": {"connect_timeout": 10}} if url.startswith("postgresql") else {}


@contextlib.contextmanager
def translated_errors(url: str):
    """Whatever fails to open a database, as one line that names it and says what to do, not a traceback."""
    try:
        yield
    except (ImportError, sqlalchemy.exc.ArgumentError) as error:
        missing = getattr(error.__cause__, "name", None) or getattr(error, "name", None)
        what = f"no module {missing}" if missing else str(error).splitlines()[0]
        raise StudyStorageError(
            f"cannot open the study storage {hidden_password(url)} ({what}): for PostgreSQL give "
            'postgresql+psycopg://USER@HOST:PORT/DATABASE and pip install -e ".[sweep]"'
        ) from None
    except sqlalchemy.exc.OperationalError as error:
        if not is_server(url):
            raise StudyStorageError(f"cannot open the study storage {url} ({first_line(error)})") from None
        where = sqlalchemy.engine.make_url(url)
        reason = first_line(error.orig).rpartition(": ")[2].strip() or type(error.orig).__name__
        raise StudyStorageError(
            f"cannot reach the study's database {where.database} on {where.host}:{where.port or 'default port'} "
            f"({reason}): start the server, create the database, or correct --sweep.storage"
        ) from None


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def hidden_password(url: str) -> str:
    with contextlib.suppress(sqlalchemy.exc.ArgumentError):
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    return url


class StudyLock:
    """Held while a process asks for a trial or takes one over: a PostgreSQL advisory lock on one connection kept for
    the whole sweep, else the file `DIR/.sweep.lock`."""

    def __init__(self, url: str, folder: Path, timeout: float = 120) -> None:
        self.url, self.folder, self.timeout = url, folder, timeout
        self._connection: sqlalchemy.Connection | None = None

    @contextlib.contextmanager
    def held(self):
        if not self.url.startswith("postgresql"):
            with held(RunLock(self.folder, ".sweep.lock"), self.timeout):
                yield
            return
        deadline = time.monotonic() + self.timeout
        while not self._query(f"SELECT pg_try_advisory_lock({ADVISORY_KEY})"):
            if time.monotonic() > deadline:
                raise StudyStorageError(f"the study in {hidden_password(self.url)} stayed locked for "
                                        f"{self.timeout:.0f} s by another sweep")  # fmt: skip
            time.sleep(0.05)
        try:
            yield
        finally:
            self._query(f"SELECT pg_advisory_unlock({ADVISORY_KEY})")

    def _query(self, sql: str):
        """On the lock's connection, opened again once if it was lost while a trial trained (an idle connection closed
        by the server or a firewall): whatever lock it held went with it."""
        for attempt in range(2):
            with translated_errors(self.url):
                try:
                    if self._connection is None:
                        engine = sqlalchemy.create_engine(self.url, poolclass=sqlalchemy.NullPool,
                                                          **engine_options(self.url))  # fmt: skip
                        self._connection = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                    return self._connection.scalar(sqlalchemy.text(sql))
                except sqlalchemy.exc.OperationalError:
                    self._connection = None
                    if attempt:
                        raise


class Ownership:
    """Who trains which trial: the file locks alone with SQLite; with a server, the heartbeats too."""

    def __init__(self, study: optuna.Study, folder: Path) -> None:
        self.study, self.storage = study, study_storage(study)
        self.study_id = self.storage.get_study_id_from_name(study.study_name)
        self.heartbeat: int | None = self.storage.get_heartbeat_interval()  # None: SQLite
        self.here = f"{socket.gethostname()} {folder.resolve()}"

    def may_take_over(self, trial: optuna.trial.FrozenTrial, stale: set[int]) -> bool:
        """Whether a running trial may have lost its process (its trial lock, tried next, decides on this machine)."""
        return self.heartbeat is None or trial_id_of(trial) in stale or trial.system_attrs.get(OWNER) == self.here

    def stale_trials(self) -> set[int]:
        return set(stale_trial_ids(self.storage, self.study_id)) if self.heartbeat else set()

    def claim(self, trial_id: int) -> None:
        """Make the trial ours in the database (under the study lock): a first heartbeat, and where we train it."""
        if self.heartbeat:
            self.storage.record_heartbeat(trial_id)
            self.storage.set_trial_system_attr(trial_id, OWNER, self.here)

    @contextlib.contextmanager
    def beating(self, trial_id: int):
        """Record the trial's heartbeats in a thread of this process while the block runs (the trial's fit)."""
        if not self.heartbeat:
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat):
                with contextlib.suppress(Exception):  # a database hiccup: the next beat tries again
                    self.storage.record_heartbeat(trial_id)

        thread = threading.Thread(target=beat, name=f"heartbeat of trial id {trial_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def try_acquire(lock: RunLock) -> bool:
    try:
        lock.acquire()
    except RunDirectoryBusy:
        return False
    return True


@contextlib.contextmanager
def held(lock: RunLock, timeout: float = 120):
    """Wait for `lock` (held by another sweep for the moment it asks for a trial), hold it, release it."""
    deadline = time.monotonic() + timeout
    while not try_acquire(lock):
        if time.monotonic() > deadline:
            raise StudyStorageError(f"{lock.path} stayed locked for {timeout:.0f} s (by {lock._holder()})")
        time.sleep(0.05)
    try:
        yield
    finally:
        lock.release()
