"""Checkpoint files that are complete or absent, never half-written, and write errors that say which file and why.

`DurableCheckpointIO` is Lightning's TorchCheckpointIO with a different write: the checkpoint is serialised into
`<file>.tmp` beside its target, fsynced, renamed over the target and the rename fsynced, so a crash, a kill or a full
disk at any instant leaves the previous file intact. Lightning's own write goes through fsspec and a staging file
that is only atomic when `$TMPDIR` is on the same filesystem, does not fsync, and reports some failures with the
wrong cause (a folder that cannot be written as `No such file or directory`; under `ulimit -f`, EFBIG without a
path); torch.save to a file turns a full disk into `RuntimeError: unexpected pos`.

Any failure, in serialising, writing, fsyncing or renaming, removes the temporary file and raises
`CheckpointWriteError`, which names the file and the operating system's reason (`No space left on device`).
Depends on torch, lightning and whole_checkpoint.py.
"""

import contextlib
import os
from pathlib import Path
from typing import Any, BinaryIO

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

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
    errno, so the OSError is kept here."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.error = file, None

    def __getattr__(self, name: str):
        return getattr(self.file, name)  # tell, fileno, ...: the file's own

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = error
            raise

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


def _reason(error: BaseException) -> tuple[str, int | None]:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror, error.errno
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first_line}" if first_line else type(error).__name__, None


class DurableCheckpointIO(TorchCheckpointIO):
    """Atomic, fsynced checkpoint writes whose failures name the file; reads as Lightning's TorchCheckpointIO, and
    reads a sharded checkpoint (a DCP folder) whole, so that a run without the sharded strategy evaluates it.

    Subclasses may override `write` to serialise another way (the tests inject write faults there).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as file:
                with keeping_write_errors(file) as writer:
                    self.write(checkpoint, writer)
                file.flush()
            replace_durably(tmp, path)
        except BaseException as error:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
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

    def load_checkpoint(self, path, *args, **kwargs) -> dict[str, Any]:
        if is_sharded(path):  # (one process, or DDP: every process reads every shard)
            return read_whole(path, weights_only=kwargs.get("weights_only") is not False)
        return super().load_checkpoint(path, *args, **kwargs)
