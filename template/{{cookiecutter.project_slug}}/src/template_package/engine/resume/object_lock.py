"""One writer per run directory in object storage, across machines: a lease on the object `<run>/.lock`.

Object stores have no flock; their compare-and-swap is the conditional write. The lock is a non-empty object created
with `If-None-Match: *` (a second create fails while it exists), naming its holder; the holder renews it every
`renew_every` seconds with `If-Match` on its ETag. A lock whose object has not changed for `expire_after` seconds,
by the store's own clock (its `Date` header against the object's `Last-Modified`, so the machines' clocks do not
matter), belongs to a machine that is gone: it is taken over with `If-Match` on that stale ETag, so that of two
machines taking it over at once one wins; a lock whose holder ran on this machine (the same host, kernel boot and
PID namespace) in a process that is gone is taken over at once. A holder that cannot renew for `give_up_after`
seconds, or finds its lock taken over, stops training. A store that does not honour the condition (a second
conditional create succeeds) is refused, unless the run is told to go without the lock.
S3's conditional writes, through s3fs (which passes them to the store): other schemes train with `--run_lock off`.
"""

import contextlib
import os
import secrets
import socket
import sys
import threading
import time
from email.utils import parsedate_to_datetime
from pathlib import Path

from .remote_run import RemoteRun, StoreError, store_reason
from .run_lock import RunDirectoryBusy

LOCK = ".lock"


def this_machine() -> str:
    """The host, the kernel's boot and the PID namespace: within the three, a PID names one process (Linux; else
    empty, and a lock is taken over only when it expires)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{socket.gethostname()} boot {boot} {os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def holder_named(lock: str) -> str:
    """The holder as the lock's text names it for people: its host and PID."""
    return lock.split(" token ")[0].strip() or "another process"


def ended_here(holder: str) -> bool:
    """Whether the lock's holder ran on this machine in a process that no longer exists."""
    ran, _, machine = holder.partition(" on ")
    pid = ran.split(" pid ")[-1].split()[0] if " pid " in ran else ""
    if not machine.strip() or machine.strip() != this_machine() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # (another user's process: alive)
        return False
    return False


def precondition_failed(error: BaseException) -> bool:
    """Whether the store refused a conditional write (s3fs turns a refused If-None-Match into FileExistsError and a
    refused If-Match into an OSError caused by the PreconditionFailed answer)."""
    cause = error.__cause__ or error
    code = getattr(cause, "response", {}).get("Error", {}).get("Code")
    return isinstance(error, FileExistsError) or code in ("PreconditionFailed", "412", "ConditionalRequestConflict")


class ObjectLock:
    """The lease on `<run>/.lock`; see the module docstring."""

    def __init__(self, run: RemoteRun) -> None:
        if run.fs.protocol[0] not in ("s3", "s3a"):
            raise SystemExit(
                f"error: {run.shown}: the run lock in object storage uses S3's conditional writes, which "
                f"{run.fs.protocol[0]}:// is not reached through here: give --run_lock off, and make sure that one fit "
                "at a time trains this run"
            )
        self.run, self.settings = run, run.settings
        self.bucket, _, key = run.root.partition("/")
        self.key = f"{key}/{LOCK}".lstrip("/")
        self.holder = f"host {socket.gethostname()} pid {os.getpid()} token {secrets.token_hex(8)} on {this_machine()}"
        self.etag: str | None = None
        self.error: StoreError | None = None
        self._renewed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, takeover: bool = False) -> None:
        """Take the lock, or raise RunDirectoryBusy naming the holder and how long ago it renewed it."""
        try:
            self._put(IfNoneMatch="*")
        except Exception as error:
            if not precondition_failed(error):
                raise
            self._take_over(takeover)
        else:
            try:
                self._put(IfNoneMatch="*")
            except Exception as error:
                if not precondition_failed(error):
                    raise
            else:  # the store wrote over an existing object: it would let two machines hold the lock
                self.release()
                raise SystemExit(
                    f"error: {self.run.shown}: the store ignores conditional writes (If-None-Match), so its lock "
                    "cannot keep two machines from training this run at once: give --run_lock off to train "
                    "without it, making sure yourself that one fit at a time trains the run"
                ) from None
        self._thread = threading.Thread(target=self._renew, name="run-lock", daemon=True)
        self._thread.start()

    def _take_over(self, at_once: bool) -> None:
        head = self.run.call("call_s3", "head_object", Bucket=self.bucket, Key=self.key)
        age = parsedate_to_datetime(head["ResponseMetadata"]["HTTPHeaders"]["date"]) - head["LastModified"]
        lock = self._read()  # (one read of the lock: who holds it, and whether that process has ended here)
        age, holder, gone = age.total_seconds(), holder_named(lock), ended_here(lock)
        if not at_once and not gone and age < self.settings.expire_after:
            raise RunDirectoryBusy(
                self.run.shown, f"{holder}, which renewed its lock {age:.0f} s ago; a lock not renewed for "
                f"{self.settings.expire_after:g} s is taken over (or at once with --run_lock takeover, if that "
                "machine is gone)",
            )  # fmt: skip
        try:
            self._put(IfMatch=head["ETag"])
        except Exception as error:
            if precondition_failed(error):  # another machine took it, or the holder renewed it, just now
                raise RunDirectoryBusy(self.run.shown, f"{self._holder()}, which has just taken the lock") from None
            raise
        why = "which has ended on this machine" if gone else f"not renewed for {age:.0f} s"
        print(f"notice: took over the run lock of {self.run.shown} from {holder}, {why}", file=sys.stderr)

    def _read(self) -> str:
        try:
            return self.run.call("cat_file", f"{self.bucket}/{self.key}").decode()
        except (FileNotFoundError, UnicodeDecodeError):
            return ""

    def _holder(self) -> str:
        return holder_named(self._read())

    def _put(self, **condition: str) -> None:
        asked = time.monotonic()
        answer = self.run.call(
            "call_s3", "put_object", Bucket=self.bucket, Key=self.key, Body=self.holder.encode(), **condition
        )
        self.etag, self._renewed_at = answer["ETag"], asked

    def _renew(self) -> None:
        wait = self.settings.renew_every
        while self.error is None and not self._stop.wait(wait):
            try:
                self._put(IfMatch=self.etag)
                wait = self.settings.renew_every
            except Exception as error:  # noqa: BLE001 - a failing store is retried until give_up_after
                wait = min(self.settings.renew_every, 2.0)
                if precondition_failed(error) and self._read() == self.holder:  # our renewal went through unseen
                    self.etag = self.run.call("info", f"{self.bucket}/{self.key}")["ETag"]
                elif precondition_failed(error):
                    self.error = StoreError(f"{self.run.shown}: the run lock was taken over by {self._holder()}")
                elif time.monotonic() - self._renewed_at > self.settings.give_up_after:
                    self.error = StoreError(
                        f"cannot renew the run lock of {self.run.shown} for {self.settings.give_up_after:g} s "
                        f"({store_reason(error)})"
                    )

    def release(self, timeout: float | None = None) -> None:
        """Stop renewing, and delete the lock if it is still this holder's, waiting at most `timeout` seconds for the
        store (request_timeout by default; a stopped run has little time left)."""
        timeout = self.settings.request_timeout if timeout is None else timeout
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if self.etag is not None and self.error is None:
            with contextlib.suppress(Exception):  # (left behind, it expires)
                self.run.call("call_s3", "delete_object", Bucket=self.bucket, Key=self.key, IfMatch=self.etag,
                              timeout=timeout)  # fmt: skip
            self.etag = None
