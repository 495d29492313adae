"""The signals that stop a training run: SIGTERM and SIGUSR1 (what SLURM and Kubernetes send before they stop a job)
and SIGINT (Ctrl-C).

Lightning's own handling does not suit a job that can be preempted: its SIGTERM handler stops at the next batch,
inside a gradient-accumulation window too, and the process exits with code 0, so a scheduler sees success and never
requeues the job; that handler is installed only once the trainer is set up, so a SIGTERM during set-up or the
sanity check also ends in exit 0; and Ctrl-C raises KeyboardInterrupt wherever the loop is, saving nothing.

`STOP_SIGNALS` handles all three (`SIGNALS`, which a sweep passes on to its trial too). Before training has started
there is nothing to save: the process exits at once with the signal's `exit_code`. Once training runs (`defer()`), a
signal is only recorded: `resume.LastCheckpoint` finishes the optimizer step, saves it and exits with that code. A
second Ctrl-C aborts at once without waiting for the save; `last.ckpt` keeps the last complete save.
Depends on nothing but the standard library.
"""

import os
import signal
import sys
import threading

# The signals that stop a run, as the module docstring says: what schedulers send before they stop a job, and Ctrl-C.
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def exit_code(signum: int) -> int:
    """The status of a process stopped by `signum`: 128 + the signal number (143 for SIGTERM, 138 for SIGUSR1, 130 for
    Ctrl-C), as a shell reports a process the signal killed, so that a scheduler sees a stopped job, not a finished
    one, and requeues it."""
    return 128 + signum


class StopSignals:
    """Handles the stop signals (`SIGNALS`) in this process; see the module docstring."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.deferred = False
        self._owner_pid: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def installed(self) -> bool:
        return self._owner_pid == os.getpid()

    @property
    def exit_code(self) -> int | None:
        return None if self.received is None else exit_code(self.received)

    def install(self) -> None:
        """Handle the signals from now on; call it again to take them back from a handler installed since
        (Lightning installs its own when the trainer has set up). Handlers can only be set in the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        if not self.installed:
            self.received, self.deferred, self._owner_pid = None, False, os.getpid()
            self._previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
        for signum in SIGNALS:
            signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        """Put back the handlers that were there before `install`."""
        if self.installed and threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
        self._owner_pid = None

    def defer(self) -> None:
        """Training has started: a signal is now only recorded, and the training loop stops at a safe point."""
        self.deferred = True

    def _handle(self, signum: int, frame) -> None:
        if os.getpid() != self._owner_pid:
            return  # a forked loader worker inherited this handler: it keeps serving batches until it is stopped
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = signum
            if not self.deferred:
                print(f"stopped by {name} before training started: nothing to save", file=sys.stderr)
                raise SystemExit(exit_code(signum))
        elif signum == signal.SIGINT:  # a second Ctrl-C: the user does not want to wait for the save
            os.write(2, b"stopped by a second Ctrl-C without saving: last.ckpt holds the last complete save\n")
            os._exit(exit_code(signum))


# Signal handlers belong to the process, so there is one of these per process.
STOP_SIGNALS = StopSignals()
