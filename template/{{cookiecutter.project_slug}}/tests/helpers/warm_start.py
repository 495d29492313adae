"""Test machinery: commands started from an interpreter that has imported the engine already, for the suite's time.

A new `python -m <package> fit` spends most of a short test run importing: torch, Lightning, and through Lightning's own
version checks torchmetrics, torchvision and scipy. `WarmStart` starts a server, `python -m helpers.warm_start`, that
imports the engine once (and what a fit imports later, and parses one `fit` command of the engine's own classes, which
fills jsonargparse's caches) and runs each command in a child forked from itself: a process of its own, which a SIGKILL
ends like any other and whose state dies with it, and which starts where a fresh `python -m <package>` stands once its
imports are done (the user's classes are imported by each child, as by a fresh process). The tests' runs start this way
(helpers/cli.py: WarmProcess), and the guarantee kit's runs in the tests (`kit_runner`). The other ranks of a DDP run
started warm are forked from its rank 0 too, and the trials of a sweep started warm from the sweep (`ForkedCommand`),
where Lightning's launcher and the sweep would start a new interpreter for each; tests/test_warm_start.py compares both.
The product itself never forks: the kit and `sweep` start their runs as a user's runs start.

The protocol, one JSON object a line: the request `{"args": [...], "cwd": DIR, "out": FILE, "err": FILE, "env":
{...}}` starts `python -m <package> ARGS` in DIR, its standard output and error appended to the files (which may be
one), with `env` as its whole environment (null: the server's); the answers are `{"pid": N}` at once and `{"pid": N,
"returncode": R}` when the child ends (a negative R: the signal that ended it). The child leads a session of its own,
so `os.killpg(pid, ...)` reaches it, its loader workers and the other ranks of a DDP run.
"""

import atexit
import contextlib
import ctypes
import faulthandler
import importlib.util
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path

ENGINE = "template_package.engine"  # (the project's package, named at baking)
STACKS_SIGNAL = signal.SIGUSR2  # a child prints every thread's stack to its standard error on it (a test that waits
# too long shows where the run waits, see dump_stacks); the engine handles SIGTERM, SIGINT, SIGUSR1 and SIGHUP only


class WarmStart:
    """A warm server to start commands from; `env` and `cwd` are the server's own (what a child inherits)."""

    def __init__(self, env: dict[str, str] | None = None, cwd: Path | None = None, dies_with_us: bool = False) -> None:
        """`dies_with_us`: the kernel SIGKILLs the server when this process dies, and each child when the server
        does (Linux; see dies_with_parent), so that nothing started from here outlives a caller killed for good."""
        self.dies_with_us = dies_with_us
        self._server = subprocess.Popen(
            [sys.executable, "-m", "helpers.warm_start"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, cwd=cwd, start_new_session=True, preexec_fn=dies_with_parent() if dies_with_us else None,
        )  # fmt: skip
        self._pending = b""
        self.returncodes: dict[int, int] = {}  # the children that have ended
        self._talking = threading.Lock()  # one thread at a time asks and reads answers (the kit runs two at once)

    def start(self, args: list[str], cwd: Path, out: Path, err: Path | None = None, env: dict | None = None) -> int:
        """Start `python -m <package> ARGS` in `cwd`, its output appended to `out` (and its errors to `err`, or to
        `out` too); its pid."""
        request = {"args": list(args), "cwd": str(cwd), "out": str(out), "err": str(err or out), "env": env,
                   "dies_with_server": self.dies_with_us}  # fmt: skip
        with self._talking:
            self._server.stdin.write((json.dumps(request) + "\n").encode())
            self._server.stdin.flush()
            while True:
                message = self._next_answer(timeout=None)
                if "returncode" not in message:
                    return message["pid"]

    def returncode(self, pid: int, timeout: float | None = None) -> int | None:
        """The child's exit status once it has ended (waiting up to `timeout` seconds, forever with None)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self.returncodes:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            with self._talking:  # (briefly: another thread may be waiting for its own child)
                if pid not in self.returncodes:
                    self._next_answer(0.2 if left is None else min(left, 0.2))  # (timeout 0: what has come)
            if left == 0:
                break
        return self.returncodes.get(pid)

    def serving(self) -> bool:
        return self._server.poll() is None

    def close(self) -> None:
        """End the server (children still running go on until they end)."""
        if self._server.poll() is None:
            self._server.stdin.close()
            self._server.wait(timeout=60)

    def _next_answer(self, timeout: float | None) -> dict | None:
        while b"\n" not in self._pending:
            ready, _, _ = select.select([self._server.stdout], [], [], timeout)
            if not ready:
                return None
            data = os.read(self._server.stdout.fileno(), 65536)
            if not data:
                raise RuntimeError(f"the warm-start server ended ({self._server.wait()})")
            self._pending += data
        line, self._pending = self._pending.split(b"\n", 1)
        message = json.loads(line)
        if "returncode" in message:
            self.returncodes[message["pid"]] = message["returncode"]
        return message


class _Forked:
    """A child forked from this process (`pid`), waited for as a subprocess.Popen is."""

    pid: int
    args: object
    returncode: int | None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode


def run_child(request: dict) -> None:
    """In the forked child: become the command, and exit with its status (never returns)."""
    code = 1
    try:
        if request.get("dies_with_server") and (die := dies_with_parent(parent=request["server"])):
            die()
        os.setsid()
        if sys.path and sys.path[0] == os.getcwd():  # `python -m` put the server's folder first on sys.path:
            sys.path[0] = os.path.abspath(request["cwd"])  # the child's, as for a new `python -m` there
        os.chdir(request["cwd"])
        out, err = (os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) for name in ("out", "err"))
        write_standard_streams_to(out, err)
        os.close(out)
        os.close(err)
        faulthandler.register(STACKS_SIGNAL, all_threads=True)  # (its loader workers and DDP ranks inherit it)
        if request["env"] is not None:  # its whole environment, as subprocess.Popen(env=...) gives: nothing of the
            os.environ.clear()  # server's stays (a TMPDIR of the test that started the server, say)
            os.environ.update(request["env"])
        tempfile.tempdir = None  # (found again from TMPDIR, as a new process finds it)
        sys.argv = [sys.argv[0], *request["args"]]
        # What `python -m <package>` would have as its main module: its name for --help, and for the command
        # Lightning starts the other processes of a DDP run with.
        package = ENGINE.rpartition(".")[0]
        main_spec = package and importlib.util.find_spec(f"{package}.__main__")
        sys.modules["__main__"].__spec__ = main_spec or importlib.util.find_spec(f"{ENGINE}.__main__")
        start_other_ranks_forked()
        if request["args"][:1] == ["sweep"]:
            start_trials_forked()
        code = run_main()
    except BaseException:  # noqa: BLE001 - the child reports a failure as a process of its own would
        traceback.print_exc()
    finally:
        exit_as_a_process_does(code)


def exit_as_a_process_does(code: int) -> None:
    """End a forked child with the exit handlers a process runs (a command's temporary files are removed by them),
    then without unwinding into the server's code it was forked from."""
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()  # (the handlers the imports and the command registered, as at a process's exit)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_main() -> int:
    """`main()` on sys.argv, as `python -m <package>` runs it; its exit status."""
    from template_package.engine.cli.main import main

    try:
        main()
        return 0
    except SystemExit as stop:
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
        return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1


def start_other_ranks_forked() -> None:
    """Have Lightning's DDP launcher fork the other ranks of this run from this process, whose imports are done,
    instead of starting each as a new `python -m <package> ARGS` (all of its imports again): a sweep's DDP trials, the
    kit's and the tests' DDP runs. Where a fork is not safe it starts them as Lightning does (see ForkedCommand)."""
    from lightning.pytorch.strategies.launchers import subprocess_script

    launcher_subprocess = types.SimpleNamespace(**{**vars(subprocess), "Popen": _rank_process})
    subprocess_script.subprocess = launcher_subprocess  # (the module Lightning's launcher calls Popen from)


def start_trials_forked() -> None:
    """Have a sweep fork its trials' fits from its own process, whose imports are done, instead of starting each as a
    new `python -m <package> fit` (sweep/search.py's start_trial, with the same environment, output and session).
    With a database server the sweep has started the trial's heartbeat thread just before: it is waiting out its first
    interval, and holds nothing the child uses. Where another thread runs, it starts them as the sweep does."""
    from template_package.engine.sweep import search

    search.subprocess = types.SimpleNamespace(**{**vars(subprocess), "Popen": _trial_process})


def _rank_process(command: list[str], env: dict | None = None, cwd: str | None = None, **kwargs):
    own_command = [sys.executable, "-m", sys.modules["__main__"].__spec__.name, *sys.argv[1:]]
    if list(command) == own_command and env is not None and ForkedCommand.safe_to_fork() and not kwargs:
        return ForkedCommand(command, env, cwd, rank=True)
    return subprocess.Popen(command, env=env, cwd=cwd, **kwargs)


HEARTBEAT = "heartbeat of trial id "  # (the name of the thread sweep/shared_study.py starts before each trial's fit)


def _trial_process(command: list[str], stdin=None, stdout=None, stderr=None, env=None, **kwargs):
    """The sweep's Popen: `python -m <engine> fit ...`, in a session of its own, its output in a log file."""
    as_the_sweep_starts = stdin == subprocess.DEVNULL and stderr == subprocess.STDOUT and hasattr(stdout, "fileno")
    if (command[:2] == [sys.executable, "-m"] and as_the_sweep_starts and env is not None
            and kwargs == {"start_new_session": True} and ForkedCommand.safe_to_fork(HEARTBEAT)):  # fmt: skip
        return ForkedCommand(command, env, None, log=stdout.fileno())
    return subprocess.Popen(command, stdin=stdin, stdout=stdout, stderr=stderr, env=env, **kwargs)


class ForkedCommand(_Forked):
    """`python -m <module> ARGS` forked from this process, used as its subprocess.Popen: it runs `main()` from the
    start with the given environment, as the new interpreter would. A DDP rank (`rank`) is forked from rank 0 when
    Lightning's launcher starts it, stays in rank 0's process group (a kill of the group ends it, as it ends a launched
    one) and has Lightning's rank-zero switch set from its environment as an import sets it. A sweep's trial (`log`: a
    descriptor for its standard output and error) leads a session of its own, its standard input empty, as the sweep
    starts it. Only safe while this process has no thread but its main one and has not initialized CUDA (checked
    before each fork). Unlike a new interpreter, it does not import again the modules this process has imported (the
    user's included), and it keeps this process's open files (the run lock excepted: a fork drops it,
    resume/run_lock.py)."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: str | None, rank: bool = False,
                 log: int | None = None) -> None:  # fmt: skip
        self.args, self.returncode = command, None
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP):
                    signal.signal(signum, signal.SIG_DFL)  # the parent's handlers are its own
                signal.signal(signal.SIGINT, signal.default_int_handler)
                atexit._clear()  # so are its exit handlers (its temporary folders, which the child must not remove)
                os.environ.clear()
                os.environ.update(env)
                tempfile.tempdir = None  # (found again from TMPDIR, as a new process finds it)
                if cwd:
                    os.chdir(cwd)
                if log is not None:  # as the sweep starts it: a session of its own, writing to its log
                    os.setsid()
                    write_standard_streams_to(log, log)
                    sys.modules["__main__"].__spec__ = importlib.util.find_spec(f"{command[2]}.__main__")
                if rank:
                    from lightning.fabric.utilities.rank_zero import _get_rank, rank_zero_only

                    rank_zero_only.rank = _get_rank() or 0  # (what importing Lightning with this environment sets)
                sys.argv = [sys.argv[0], *command[3:]]
                code = run_main()
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
            finally:
                exit_as_a_process_does(code)

    @staticmethod
    def safe_to_fork(waiting_thread: str | None = None) -> bool:
        """No thread but the main one (and threads named `waiting_thread...`, known to be waiting), no CUDA."""
        import torch

        others = [t for t in threading.enumerate() if t is not threading.main_thread()]
        waiting = [t for t in others if waiting_thread and t.name.startswith(waiting_thread)]
        return len(others) == len(waiting) and not torch.cuda.is_initialized()

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def write_standard_streams_to(out: int, err: int) -> None:
    """In a forked child: standard input empty, standard output and error the descriptors `out` and `err` (which may be
    one), and Python's streams on them, as a new process's."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    for fd, target in enumerate((devnull, out, err)):
        os.dup2(target, fd)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the new process's standard streams
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def dump_stacks(pid: int, err: Path) -> str:
    """Have child `pid` and the rest of its process group (loader workers, DDP ranks), one after the other, print their
    threads' stacks to its standard error `err`; what that file held last, and the stacks."""
    before = err.stat().st_size if err.exists() else 0
    for member in [pid, *sorted(set(group_members(pid)) - {pid})]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, STACKS_SIGNAL)
            time.sleep(1)  # (one at a time: they write to the same file)
    return err.read_bytes()[max(0, before - 4000) :].decode(errors="replace") if err.exists() else "(no standard error)"


def group_members(group: int) -> list[int]:
    """The processes of process group `group` (Linux's /proc; none elsewhere)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rpartition(")")[2].split()  # (after the command's name, which may hold spaces)
            if int(fields[2]) == group:  # state, ppid, pgrp
                members.append(int(stat.parent.name))
    return members


def dies_with_parent(parent: int | None = None):
    """A function for a child of `parent` (this process by default) to call at its start (a `preexec_fn`) that has
    the kernel SIGKILL it when its parent dies (Linux's PR_SET_PDEATHSIG); None elsewhere. (PR_SET_PDEATHSIG follows
    the thread that forked: the caller's main thread, say, not a thread that ends before the child does.)"""
    if not sys.platform.startswith("linux"):
        return None
    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, parent or os.getpid()

    def set_death_signal() -> None:
        prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died between the fork and now
            os._exit(1)

    return set_death_signal


def serve() -> None:
    """Read requests from stdin, fork a child for each, answer with its pid and, later, its exit status."""
    from template_package.engine.cli.main import main  # noqa: F401 - imported once here, for every child

    with contextlib.suppress(ImportError):  # what a fit imports on its way: the default logger's writer (TensorBoard)
        import torch.utils.tensorboard  # noqa: F401 - and the report room's callbacks

        from template_package.engine.report import confusion, flops, progress, throughput  # noqa: F401

    with contextlib.suppress(ImportError):  # jsonargparse's stub search path, found by starting another Python
        from jsonargparse._stubs_resolver import get_stubs_resolver  # (slow: it imports): found once

        get_stubs_resolver()
    parse_a_fit_command()

    children: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.05 if children else None)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                answer({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})
        if not ready:
            continue
        data = os.read(0, 65536)
        if not data:  # the caller is gone: so is the server (children end on their own)
            return
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = {**json.loads(line), "server": os.getpid()}
            pid = os.fork()
            if pid == 0:
                run_child(request)
            children.add(pid)
            answer({"pid": pid})


def parse_a_fit_command() -> None:
    """Parse a `fit` command once, which prints its config and exits: jsonargparse keeps what it reads of the Trainer's
    and the callbacks' signatures and docstrings, which every child would otherwise read again. Only the engine's
    classes, and not the default config (which names the user's): each child imports the user's classes itself."""
    from template_package.engine.cli import main

    default_config = os.environ.get(main.DEFAULT_CONFIG_VARIABLE)
    os.environ[main.DEFAULT_CONFIG_VARIABLE] = ""  # (none)
    command = ["fit", "--print_config", f"--model={ENGINE}.training.recipe.TrainingRecipe",
               "--data=lightning.LightningDataModule"]  # fmt: skip
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main.build_cli(command)
    finally:
        if default_config is None:
            del os.environ[main.DEFAULT_CONFIG_VARIABLE]
        else:
            os.environ[main.DEFAULT_CONFIG_VARIABLE] = default_config


def answer(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


if __name__ == "__main__":
    serve()


_SERVERS: dict[tuple, WarmStart] = {}  # by environment, ended when this process ends
_MAKING = threading.Lock()  # (the kit asks from two threads)


def warm_server(env: dict[str, str], cwd: Path) -> WarmStart:
    """A warm server for this test process's runs with this environment (its start imports the engine once)."""
    key = tuple(sorted(env.items()))
    with _MAKING:
        if key not in _SERVERS or not _SERVERS[key].serving():
            _SERVERS[key] = WarmStart(env=env, cwd=cwd)
            atexit.register(_SERVERS[key].close)
        return _SERVERS[key]


def kit_runner(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """What GuaranteeKit(run=...) takes: its runs started warm (guarantees.run_command starts new interpreters)."""
    warm = warm_server(env, cwd)
    folder = Path(tempfile.mkdtemp(prefix="kit-run-"))
    out, err = folder / "out", folder / "err"
    pid = warm.start(list(args), cwd, out, err)
    returncode = warm.returncode(pid, timeout=900)
    if returncode is None:
        os.killpg(pid, signal.SIGKILL)
        returncode = warm.returncode(pid)
    result = subprocess.CompletedProcess(list(args), returncode, out.read_text(), err.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    return result
