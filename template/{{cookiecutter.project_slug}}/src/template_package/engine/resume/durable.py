"""Checkpoint files that are complete or absent, never half-written, each with its digest, and write errors that say
which file and why.

`DurableCheckpointIO` is Lightning's TorchCheckpointIO with a different write: the checkpoint is serialised into
`<file>.tmp` beside its target, fsynced, renamed over the target and the rename fsynced, so a crash, a kill or a full
disk at any instant leaves the previous file intact. Lightning's own write goes through fsspec and a staging file
that is only atomic when `$TMPDIR` is on the same filesystem, does not fsync, and reports some failures with the
wrong cause (a folder that cannot be written as `No such file or directory`; under `ulimit -f`, EFBIG without a
path); torch.save to a file turns a full disk into `RuntimeError: unexpected pos`. Beside each file goes its digest
(`<file>.crc32`, digests.py), computed from the bytes as they are written, renamed into place just before the file;
a read checks the file against it, and a removal removes both.

Any failure, in serialising, writing, fsyncing or renaming, removes the temporary files and raises
`CheckpointWriteError`, which names the file and the operating system's reason (`No space left on device`).
Depends on torch, lightning, digests.py and whole_checkpoint.py.
"""

import contextlib
import os
import shutil
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

from .digests import TAKEN_AT, digest_of, taken_at, verify, write_digest
from .whole_checkpoint import is_sharded, read_whole


class CheckpointWriteError(OSError):
    """A checkpoint could not be written; the file it would have replaced is unchanged.

    `path` is the file being written, `reason` the cause (the errno text for an OSError, whose errno it keeps).
    """

    def __init__(self, path: Path, reason: str, errno: int | None = None) -> None:
        super().__init__(errno, reason)
        self.path, self.reason = Path(path), reason

    def __str__(self) -> str:
        return f"cannot write the checkpoint {self.path} ({self.reason})"


def fsync(path: Path) -> None:
    """Flush `path` to the disk; for a folder, the entries created or renamed in it."""
    fd = os.open(path, os.O_RDONLY)  # a folder opens read-only too
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(written: Path, path: Path) -> None:
    """Put `written`, a file written whole (or a link), in `path`'s place, so that a crash or a kill at any moment
    leaves the old one or the new one, whole: its bytes reach the disk before the rename, the rename before this
    returns."""
    if not written.is_symlink():
        fsync(written)
    os.replace(written, path)
    fsync(path.parent)


def snapshot(checkpoint: dict) -> tuple[dict, torch.cuda.Event | None]:
    """A copy of `checkpoint` that training cannot change: CPU tensors cloned, CUDA tensors copied to pinned host
    memory without waiting for the GPU; the event (None without CUDA tensors) marks when those copies are done."""
    on_cuda = False

    def copy(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal on_cuda
        if tensor.is_cuda:
            on_cuda = True
            return tensor.detach().to("cpu", non_blocking=True)  # a non-blocking device-to-host copy pins its target
        return tensor.detach().clone()

    state = apply_to_collection(checkpoint, torch.Tensor, copy)  # containers are rebuilt, so they are copies too
    if not on_cuda:
        return state, None
    event = torch.cuda.Event()
    event.record()
    return state, event


class _KeepsWriteErrors:
    """The file as torch.save sees it: torch turns a failed write into `RuntimeError: unexpected pos`, losing the
    errno, so the OSError is kept here; and the CRC-32 and size of the bytes written, the file's digest (torch writes
    a file from its first byte to its last, never going back)."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.error, self.crc, self.size = file, None, 0, 0

    def __getattr__(self, name: str):
        return getattr(self.file, name)  # tell, fileno, ...: the file's own

    def write(self, data) -> int:
        try:
            written = self.file.write(data)  # (a buffered file writes all of it, or raises)
        except OSError as error:
            self.error = error
            raise
        self.crc, self.size = zlib.crc32(data, self.crc), self.size + memoryview(data).nbytes
        return written

    def flush(self) -> None:
        self.file.flush()


@contextlib.contextmanager
def keeping_write_errors(file: BinaryIO):
    """`file` for torch.save: a failed write raises its OSError (the disk is full), not torch's `unexpected pos`."""
    writer = _KeepsWriteErrors(file)
    try:
        yield writer
    except RuntimeError:
        if writer.error is None:
            raise
        raise writer.error from None


def keep_as(path: Path, previous: Path) -> None:
    """Make `previous` and its digest the file `path` and its digest as they are now, durably, each by one rename of a
    hard link (a copy where the filesystem has none), the digest first: at every instant `path`'s pair is whole."""
    for source, target in ((digest_of(path), digest_of(previous)), (path, previous)):
        if not source.exists():  # (a file written without a digest)
            target.unlink(missing_ok=True)
            continue
        link = temporary(target)
        link.unlink(missing_ok=True)
        try:
            os.link(source, link)
        except OSError:
            shutil.copyfile(source, link)
        replace_durably(link, target)


def temporary(path: Path) -> Path:
    """Where `path` is written before it is renamed into place (removed at a run's start: resume/exact_resume.py)."""
    return path.with_name(path.name + ".tmp")


def _reason(error: BaseException) -> tuple[str, int | None]:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror, error.errno
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__, None


class DurableCheckpointIO(TorchCheckpointIO):
    """Atomic, fsynced checkpoint writes with their digests, whose failures name the file; reads as Lightning's
    TorchCheckpointIO once the file matches its digest, and reads a sharded checkpoint (a DCP folder) whole, so that a
    run without the sharded strategy evaluates it.

    Subclasses may override `write` to serialise another way (the tests inject write faults there).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        """Write `checkpoint` to `path`, its digest beside it. `storage_options={"previous": P}` keeps the file `path`
        replaces as `P`, with its digest, until the new one is durable (last.ckpt's previous.ckpt): a crash at any
        instant leaves one pair whole, holding the newest state written or the one before."""
        options = dict(storage_options or {})
        previous = options.pop("previous", None)
        if options:
            raise TypeError(f"{type(self).__name__} takes no storage_options but previous, not {set(options)}")
        path = Path(path)
        tmp, digest_tmp = temporary(path), temporary(digest_of(path))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as file:
                with keeping_write_errors(file) as writer:
                    self.write(checkpoint, writer)
                file.flush()
                os.fsync(file.fileno())  # durable before the previous state is moved
            write_digest(digest_tmp, writer.crc, writer.size, checkpoint.get(TAKEN_AT))
            if previous is not None and path.is_file():
                keep_as(path, Path(previous))
            # The digest first: a crash between the renames leaves a file that fails its digest, beside a whole
            # previous one, never a new file without its digest.
            replace_durably(digest_tmp, digest_of(path))
            replace_durably(tmp, path)
        except BaseException as error:
            for leftover in (tmp, digest_tmp):
                with contextlib.suppress(OSError):
                    leftover.unlink(missing_ok=True)
            if isinstance(error, Exception):
                raise CheckpointWriteError(path, *_reason(error)) from error
            raise  # KeyboardInterrupt, SystemExit: not a write error

    def write(self, checkpoint: dict[str, Any], file: BinaryIO) -> None:
        torch.save(checkpoint, file)

    def logs_flushed(self) -> None:
        """Called in the training thread once the loggers are flushed, before a last.ckpt write: a run directory in
        object storage reads the loggers' files here (remote_run.MirroredCheckpointIO)."""

    def failure(self) -> Exception | None:
        """What must stop training now, asked at every step (a run directory in object storage whose store failed)."""
        return None

    def remove_checkpoint(self, path) -> None:
        """The file, then its digest: a kill in between leaves a digest alone, never a file without its digest."""
        super().remove_checkpoint(path)
        digest_of(path).unlink(missing_ok=True)

    def checkpoints_in(self, folder: Path) -> dict[Path, float]:
        """The checkpoint files in `folder` whose digest (written by this class) says when their state was taken, and
        that time: what a resumed run finds written by a stopped run after its own state (leftovers.py)."""
        found = {path: taken_at(digest_of(path).read_text()) for path in Path(folder).glob("*.ckpt")
                 if path.is_file() and digest_of(path).is_file()}  # fmt: skip
        return {path: time for path, time in found.items() if time is not None}

    def load_checkpoint(self, path, *args, **kwargs) -> dict[str, Any]:
        """The checkpoint, once it matches its digest (digests.DamagedCheckpoint otherwise)."""
        if is_sharded(path):  # (one process, or DDP: every process reads every shard)
            return read_whole(path, weights_only=kwargs.get("weights_only") is not False)
        verify(path)
        return super().load_checkpoint(path, *args, **kwargs)
