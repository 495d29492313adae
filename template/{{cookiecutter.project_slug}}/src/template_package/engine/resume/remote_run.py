"""A run directory in object storage: `--trainer.default_root_dir s3://bucket/run`, or any fsspec URL.

Object stores have no rename, no append and no flock, and a preemptible machine loses its disk when it is reclaimed.
So each process works in a new local folder of its own, exactly as in a local run directory, and the store holds the
run:
- at the start, the run's files are read from the store: the loggers' files, config.yaml, and the checkpoint a
  command resumes or evaluates; nothing an earlier machine left on its own disk is read;
- one background thread (`Uploads`) uploads what the run writes, an object at a time, each whole: a PUT, or a
  multipart upload completed at its end, so the store shows the previous object or the new one, never a part. The
  loggers' files are read in the training thread right after they are flushed and go up before the checkpoint written
  after them, so a run resumed from the store finds every step logged before its checkpoint. A save while an upload
  is in flight does not wait for it: the newest version of each file follows (versions in between are skipped). A
  checkpoint goes up with its digest (digests.py), the digest first, as one item: at any instant at most the pair in
  flight is inconsistent, and last.ckpt's or previous.ckpt's is whole (exact_resume.py);
- a store that fails is retried with backoff; when no request has succeeded for `give_up_after` seconds, training
  stops in one line naming the URL and the error, and the local folder, which holds the newest state, is kept;
- at the end, or at a stop signal (within `stop_timeout`), what is left is uploaded.
Depends on fsspec (and the store's filesystem package: s3fs for s3://), lightning and durable.py.
"""

import contextlib
import itertools
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import fsspec
import lightning as L
from lightning.pytorch.callbacks import Callback

from .digests import SUFFIX, digest_of, taken_at
from .durable import DurableCheckpointIO

# The filesystem package each scheme needs, and the project's extra that installs it.
PACKAGES = {"s3": ("s3fs", ".[s3]"), "s3a": ("s3fs", ".[s3]"), "gs": ("gcsfs", None), "gcs": ("gcsfs", None),
            "az": ("adlfs", None), "abfs": ("adlfs", None)}  # fmt: skip
CHECKPOINTS = "checkpoints"
NOT_OF_THE_LOGS = (f"{CHECKPOINTS}/", ".lock", ".pinned/", ".fetched/")  # what Uploads.logs leaves out


@dataclass
class StoreSettings:
    """How a run directory in object storage is kept (docs/object-storage.md).

    Args:
        renew_every: seconds between renewals of the run's lock (object_lock.py).
        expire_after: seconds without a renewal after which another machine takes the lock over (>= 3 renewals).
        give_up_after: seconds of a failing store (uploads or lock renewals) after which training stops; less than
            expire_after minus request_timeout, so that a run stops before another machine may take it over.
        request_timeout: seconds a request to the store may wait for an answer before it counts as failed.
        stop_timeout: seconds a stopped run (SIGTERM, SIGUSR1, Ctrl-C) spends uploading its last state; below the
            grace period that Kubernetes and cloud preemption give by default.
        logs_every: seconds between uploads of the loggers' files at epochs' ends (they go up with each last.ckpt
            too): flushing and reading them at every short epoch would cost the steps a share.
    """

    renew_every: float = 30.0
    expire_after: float = 150.0
    give_up_after: float = 90.0
    request_timeout: float = 30.0
    stop_timeout: float = 25.0
    logs_every: float = 30.0


class StoreError(RuntimeError):
    """The store failed for longer than allowed, or the run's lock was lost: training stops (one line)."""


def is_url(path: Any) -> bool:
    """Whether a run directory or checkpoint path names a store (`s3://...`); `file://` and plain paths are local."""
    scheme = urlsplit(str(path)).scheme
    return len(scheme) > 1 and scheme != "file" and "://" in str(path)


def redacted(url: str) -> str:
    """`url` as it may be shown and saved: without a user or password in it, or a query (a presigned signature)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def store_of(url: str, request_timeout: float = 30.0):
    """The fsspec filesystem and path of `url`, or one line naming the package its scheme needs."""
    scheme = urlsplit(url).scheme
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError:
        package, extra = PACKAGES.get(scheme, (f"the fsspec filesystem of {scheme}://", None))
        install = f'pip install -e "{extra}"' if extra else f"pip install {package}"
        raise SystemExit(f"error: {redacted(url)} needs {package}: {install}") from None
    except ValueError:
        raise SystemExit(f"error: {redacted(url)}: fsspec knows no storage {scheme}://") from None
    options: dict = {"skip_instance_cache": True, "use_listings_cache": False}
    parts = urlsplit(url)
    if scheme in ("s3", "s3a"):  # our own retries and give_up_after decide, not hidden ones of minutes
        timeouts = {"connect_timeout": request_timeout, "read_timeout": request_timeout}
        options["config_kwargs"] = {**timeouts, "retries": {"max_attempts": 2, "mode": "standard"}}
        if parts.username:  # keys in the URL (s3://KEY:SECRET@bucket/run), which nothing shows or saves
            options.update(key=unquote(parts.username), secret=unquote(parts.password or ""))
            url = urlunsplit((parts.scheme, parts.hostname or "", parts.path, parts.query, ""))
    return fsspec.core.url_to_fs(url, **options)


def call(fs, request_timeout: float, method: str, *args, size: int = 0, **kwargs):
    """`fs.<method>(...)` that fails (fsspec's FSTimeoutError) when the store has not answered within request_timeout
    plus a second a megabyte of `size`: a store that stopped answering would hold its caller for good (botocore's own
    read timeout does not reach s3fs's requests). A `timeout` given overrides it."""
    if fs.async_impl:
        kwargs.setdefault("timeout", request_timeout + size / 1e6)
    else:
        kwargs.pop("timeout", None)
    return getattr(fs, method)(*args, **kwargs)


def fetch(url: str, folder: Path) -> Path:
    """Download the file `url` into `folder` (a checkpoint named by URL, with its digest where it has one); one line if
    it is not there."""
    fs, path = store_of(url)
    folder.mkdir(parents=True, exist_ok=True)
    for name in (path + SUFFIX, path):
        try:
            size = call(fs, StoreSettings.request_timeout, "info", name).get("size") or 0
            call(fs, StoreSettings.request_timeout, "get_file", name, str(folder / Path(name).name), size=size)
        except FileNotFoundError:
            if name == path:
                url = redacted(url)
                raise SystemExit(f"error: --ckpt_path {url} does not exist: give the URL of a .ckpt file") from None
    return folder / Path(path).name


class RemoteRun:
    """The run directory `url` in object storage, worked on in the local folder `local` (see the module docstring).
    `uploads` exists in the process that writes the run (global rank 0 of a fit)."""

    def __init__(self, url: str, settings: StoreSettings) -> None:
        self.url, self.shown = url.rstrip("/"), redacted(url).rstrip("/")
        self.settings = settings
        self.fs, self.root = store_of(url, settings.request_timeout)
        self.local = Path(tempfile.mkdtemp(prefix="run-")).resolve()  # (as ModelCheckpoint resolves its folder)
        self.uploads: Uploads | None = None
        self.finished: bool | None = None  # once finish() has run: whether everything reached the store

    def call(self, method: str, *args, size: int = 0, **kwargs):
        """`self.fs.<method>(...)` within request_timeout (see `call`)."""
        return call(self.fs, self.settings.request_timeout, method, *args, size=size, **kwargs)

    def fetch_run(self) -> None:
        """Read the run's files from the store, but for its checkpoints (those a command needs: `fetch`)."""
        try:
            found = self.call("find", self.root, detail=True)
        except FileNotFoundError:
            return  # a new run
        for path, info in found.items():
            relative = path[len(self.root) :].lstrip("/")
            if relative and not relative.startswith(NOT_OF_THE_LOGS):
                (self.local / relative).parent.mkdir(parents=True, exist_ok=True)
                self.call("get_file", path, str(self.local / relative), size=info.get("size") or 0)

    def fetch(self, relative: str) -> Path | None:
        """The run's checkpoint `relative` and its digest (where it has one) read from the store into the local
        folder; None if the store has no such checkpoint."""
        for name in (relative + SUFFIX, relative):
            local = self.local / name
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                size = self.call("info", f"{self.root}/{name}").get("size") or 0
                self.call("get_file", f"{self.root}/{name}", str(local), size=size)
            except FileNotFoundError:
                local.unlink(missing_ok=True)
        return local if local.exists() else None

    def shown_path(self, path: Any) -> str:
        """A local path of the run as the store's URL, for messages."""
        text, local = str(path), str(self.local)
        return self.shown + text[len(local) :] if text.startswith(local) else text

    def start_uploads(self) -> "Uploads":
        self.uploads = Uploads(self)
        return self.uploads

    def finish(self, timeout: float | None) -> bool:
        """Upload what is left within `timeout` (None: as long as the store answers). Whether all is in the store."""
        if self.finished is None:
            if self.uploads is not None:
                self.uploads.logs()
            self.finished = self.uploads is None or self.uploads.close(timeout)
        return self.finished

    def close(self) -> None:
        """Remove the local folder, once all it holds is in the store (else it is kept: messages name it)."""
        if self.finished:
            shutil.rmtree(self.local, ignore_errors=True)


class Uploads:
    """One thread that uploads the run's files in the order they were handed over, each object whole; see the module
    docstring. A file handed over again before it went up is uploaded once, in its newest version, at its new place
    in the order."""

    def __init__(self, run: RemoteRun) -> None:
        self.run, self.error = run, None
        # file -> its content (a log), pinned copies of a checkpoint and its digest, or None: delete both
        self._queue: dict[str, bytes | tuple[Path, Path | None] | None] = {}
        self._seen: dict[str, tuple[int, int]] = {}  # the loggers' files as last read: size, modification time
        self._pins = itertools.count()
        self._busy = self._closing = False
        self._in_flight: bytes | tuple | None = None  # what is going up now
        self._changed = threading.Condition()
        self.logs(enqueue=False)  # what was read from the store is there already
        self._thread = threading.Thread(target=self._upload_all, name="run-uploads", daemon=True)
        self._thread.start()

    def file(self, path: Path) -> None:
        """Upload the checkpoint `path` of the run and its digest (where it has one), as they are now."""
        pins = []
        for source in (path, digest_of(path)) if digest_of(path).exists() else (path,):
            pins.append(self.run.local / ".pinned" / str(next(self._pins)))
            pins[-1].parent.mkdir(exist_ok=True)
            os.link(source, pins[-1])  # this version, whatever replaces the file before it goes up
        self._hand_over(self._relative(path), (*pins, None)[:2])

    def deleted(self, path: Path) -> None:
        self._hand_over(self._relative(path), None)

    def logs(self, enqueue: bool = True) -> None:
        """Hand over every file outside checkpoints/ that changed since the last call (the loggers' files,
        config.yaml, predictions.csv), read now: call it in the thread that writes them, after they are flushed."""
        for path in sorted(self.run.local.rglob("*")):
            relative = self._relative(path)
            if relative.startswith(NOT_OF_THE_LOGS) or not path.is_file():
                continue
            stat = path.stat()
            if self._seen.get(relative) != (stat.st_size, stat.st_mtime_ns):
                self._seen[relative] = (stat.st_size, stat.st_mtime_ns)
                if enqueue:
                    self._hand_over(relative, path.read_bytes())

    def close(self, timeout: float | None) -> bool:
        """Wait until everything handed over is uploaded, or the store failed for good, or `timeout` passed; then
        stop the thread. Whether everything was uploaded."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while (self._queue or self._busy) and self.error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left)
            done = not self._queue and not self._busy and self.error is None
            self._closing = True
            self._changed.notify_all()
        return done

    def _relative(self, path: Path) -> str:
        return Path(path).relative_to(self.run.local).as_posix()

    def _hand_over(self, relative: str, content: bytes | tuple | None) -> None:
        with self._changed:
            older = self._queue.pop(relative, None)
            if older is not self._in_flight:  # (the one going up now is dropped once it is up)
                self._drop(older)
            self._queue[relative] = content
            self._changed.notify_all()

    def _upload_all(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._closing:
                    self._changed.wait()
                if self._closing or self.error is not None:
                    return
                relative, content = next(iter(self._queue.items()))
                self._busy, self._in_flight = True, content
            try:
                self._upload(relative, content)
            finally:
                with self._changed:
                    if self._queue.get(relative, False) is content:  # (not handed over again meanwhile)
                        del self._queue[relative]
                    self._drop(content)
                    self._busy, self._in_flight = False, None
                    self._changed.notify_all()

    def _upload(self, relative: str, content: bytes | tuple | None) -> None:
        """One object (a checkpoint: and its digest, the digest first; a removal of both, the file first; no pinned
        copy: the object is removed), retried with backoff until the store takes it or has failed for give_up_after
        seconds."""
        run, target = self.run, f"{self.run.root}/{relative}"
        failing_since, delay = None, 0.5
        while not self._closing:
            try:
                if isinstance(content, bytes):
                    run.call("pipe_file", target, content, size=len(content))
                    return
                data, digest = content or (None, None)
                for pinned, name in ((digest, target + SUFFIX), (data, target))[:: 1 if content else -1]:
                    if pinned is None:
                        with contextlib.suppress(FileNotFoundError):
                            run.call("rm_file", name)
                    else:
                        run.call("put_file", str(pinned), name, size=pinned.stat().st_size)
                return
            except Exception as error:  # noqa: BLE001 - any failure of the store is retried, then reported
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since >= self.run.settings.give_up_after:
                    self.error = StoreError(
                        f"cannot upload to {self.run.shown} for {self.run.settings.give_up_after:g} s "
                        f"({store_reason(error)}): the store keeps the last checkpoint it received; the newest state "
                        f"is in {self.run.local}"
                    )
                    return
                time.sleep(delay)
                delay = min(2 * delay, 8.0)

    @staticmethod
    def _drop(content: bytes | tuple | None) -> None:
        for pinned in content if isinstance(content, tuple) else ():
            if pinned is not None:
                pinned.unlink(missing_ok=True)


def store_reason(error: BaseException) -> str:
    """A store's error in a few words: its type and first line (a timeout: no answer)."""
    text = str(error).strip().splitlines()[0][:200] if str(error).strip() else "no answer in time"
    return f"{type(error).__name__}: {text}"


class MirroredCheckpointIO(DurableCheckpointIO):
    """The checkpoint writes of a run in object storage: each written durably into the local folder, then handed to
    the uploads; a removed checkpoint (a best one that is no longer) is removed from the store too. `failure` is what
    stops training (LastCheckpoint asks at every step): the store failed for good, or `lock` was lost."""

    def __init__(self, uploads: Uploads, lock=None) -> None:
        super().__init__()
        self.uploads, self.lock = uploads, lock

    def save_checkpoint(self, checkpoint: dict, path, storage_options: Any | None = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        previous = (storage_options or {}).get("previous")
        if previous is not None and Path(previous).exists():  # (the previous state first, as renamed locally)
            self.uploads.file(Path(previous))
        self.uploads.file(Path(path))

    def remove_checkpoint(self, path) -> None:
        super().remove_checkpoint(path)
        self.uploads.deleted(Path(path))

    def checkpoints_in(self, folder: Path) -> dict[Path, float]:
        """DurableCheckpointIO's, of the store's copy of the run's `folder` (its digests read from the store), by
        their local paths."""
        run, found = self.uploads.run, {}
        prefix = f"{run.root}/{Path(folder).relative_to(run.local).as_posix()}"
        try:
            names = {path.rsplit("/", 1)[-1] for path in run.call("ls", prefix, detail=False)}
        except FileNotFoundError:
            return {}
        for name in sorted(name for name in names if name.endswith(".ckpt") and name + SUFFIX in names):
            found[Path(folder) / name] = taken_at(run.call("cat_file", f"{prefix}/{name}{SUFFIX}").decode())
        return {path: time for path, time in found.items() if time is not None}

    def logs_flushed(self) -> None:
        self.uploads.logs()

    def failure(self) -> StoreError | None:
        lost = getattr(self.lock, "error", None)
        if lost is not None:  # (the uploads' error names the local folder already)
            return StoreError(f"{lost}; the newest state is in {self.uploads.run.local}")
        return self.uploads.error


class StoreSync(Callback):
    """The loggers' files of a run in object storage go up at an epoch's end too, at most every `logs_every`
    seconds, not only with last.ckpt."""

    def __init__(self, uploads: Uploads) -> None:
        self.uploads, self._last = uploads, time.monotonic()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if time.monotonic() - self._last < self.uploads.run.settings.logs_every:
            return
        self._last = time.monotonic()
        for logger in trainer.loggers:
            logger.save()
        self.uploads.logs()
