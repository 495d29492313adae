"""Sharded checkpoints (torch.distributed.checkpoint folders) that are complete or absent, never a mix of two steps.

DCP writes every process's shards into one folder and, given an existing folder, overwrites its files in place: a
kill or a full disk part-way through leaves a folder of two steps, and the last good state is gone. Lightning's issue
#20012 (atomic distributed saves) was closed without a fix. Here, in the checkpoint's folder:

    last.ckpt -> .last.ckpt.120-3f9a0c1e     a symbolic link, replaced in one rename
    .last.ckpt.120-3f9a0c1e/                 Lightning's DCP layout: .metadata, __<rank>_0.distcp, meta.pt

A save (`save`, called by every process):
1. rank 0 removes what earlier saves left, creates a new folder beside the target (named after the step, with a
   random suffix) and only then tells the others its name;
2. every process writes its shards there, each file fsynced (DCP; rank 0 writes `.metadata` once every shard is
   written, and DCP raises on every process if any process failed);
3. rank 0 writes meta.pt (the rest of Lightning's checkpoint) durably, fsyncs the folder, points a new link at it
   under a temporary name and renames that over the target (a rename replaces a link atomically, a folder it cannot),
   and fsyncs the checkpoint folder;
4. every process learns the outcome and raises the same `CheckpointWriteError` if any step failed anywhere;
5. rank 0 removes the folders no link points to any more: the previous version, and what a killed save left.
A kill at any instant leaves the target pointing at the previous complete folder. Every wait among the processes is
on `group`, a gloo group whose timeout bounds it, so a process that died or stalled stops the others in seconds, not
at the training group's 30-minute timeout. PyTorch's own tools read the target as any DCP folder
(`torch.distributed.checkpoint.format_utils.dcp_to_torch_save`).

Depends on torch and durable.py and whole_checkpoint.py.
"""

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import StorageWriter
from torch.distributed.checkpoint.api import CheckpointException

from ..training.steps import steps_in
from .durable import CheckpointWriteError, DurableCheckpointIO, fsync, replace_durably
from .whole_checkpoint import META

VERSION = re.compile(r"^\.(?P<name>.+)\.\d+-[0-9a-f]{8}$")  # .last.ckpt.120-3f9a0c1e
TEMPORARY_LINK = re.compile(r"^\.(?P<name>.+)\.link-[0-9a-f]{8}$")


def save(
    shards: dict,
    rest: dict,
    path: Path,
    group: dist.ProcessGroup,
    storage_writer: Callable[[Path], StorageWriter],
) -> None:
    """Write a checkpoint whose tensors are `shards` (this process's, as DCP takes them) and whose other parts are
    `rest` (rank 0's) as the DCP folder `path` points to; see the module docstring. Called by every process."""
    rank, folder = dist.get_rank(group), None
    try:
        folder = path.parent / _new_folder(path, steps_in(rest), rank, group)
        dcp.save(shards, storage_writer=storage_writer(folder), process_group=group)
    except CheckpointException as failed:  # raised on every process: one of them failed to write its part
        _remove_if_rank_zero(rank, folder)
        raise _write_error(path, failed) from None
    except (dist.DistError, RuntimeError, OSError) as error:  # another process died or stalled; no new folder
        _remove_if_rank_zero(rank, folder)
        raise _write_error(path, error) from None
    failure = None
    if rank == 0:
        try:
            _swap_in(folder, path, rest)
        except Exception as error:  # noqa: BLE001 - every process must hear of it, whatever it was
            failure = _write_error(path, error)
            _remove_if_rank_zero(rank, folder)
    try:
        failures = [None] * dist.get_world_size(group)
        dist.all_gather_object(failures, failure and (failure.reason, failure.errno), group=group)
    except (dist.DistError, RuntimeError) as error:
        raise _write_error(path, error) from None
    reason = next((f for f in failures if f is not None), None)
    if reason is not None:
        raise CheckpointWriteError(path, *reason)
    if rank == 0:
        remove_leftovers(path.parent)  # the previous version


def _new_folder(path: Path, step: int, rank: int, group: dist.ProcessGroup) -> str:
    """The name of the new folder beside `path`, which rank 0 creates (after removing leftovers) before the others
    learn the name: nothing else writes into the checkpoint folder meanwhile. Rank 0's failure, raised everywhere."""
    made: tuple[str | None, tuple | None] = (None, None)
    if rank == 0:
        name = f".{path.name}.{step}-{secrets.token_hex(4)}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_leftovers(path.parent)
            (path.parent / name).mkdir()
            made = (name, None)
        except OSError as error:
            made = (None, (error.strerror or str(error), error.errno))
    agreed = [made]
    dist.broadcast_object_list(agreed, group_src=0, group=group)
    name, error = agreed[0]
    if error is not None:
        raise CheckpointWriteError(path, *error)
    return name


def _swap_in(folder: Path, path: Path, rest: dict) -> None:
    """Make `path` point to the complete `folder` (rank 0, once every shard is written)."""
    DurableCheckpointIO().save_checkpoint(rest, folder / META)  # temporary file, fsync, rename, fsync
    fsync(folder)  # the shards' and .metadata's names
    link = path.with_name(f".{path.name}.link-{secrets.token_hex(4)}")
    os.symlink(folder.name, link)  # relative: the run directory can be moved or copied
    if path.is_dir() and not path.is_symlink():
        # A folder Lightning's own ModelParallelStrategy wrote in place: a rename cannot replace a folder, so it is
        # moved aside first (and removed once unreferenced). Only the first save of such a run has this instant
        # without a target.
        path.rename(path.with_name(f".{path.name}.0-{secrets.token_hex(4)}"))
    replace_durably(link, path)


def remove(path: Path) -> None:
    """Remove a checkpoint: a link and the folder it points to (the link first: a kill in between leaves a folder
    that no link points to, which the next save removes), a folder, or a file."""
    if path.is_symlink():
        target = path.parent / os.readlink(path)
        path.unlink()
        fsync(path.parent)
        if VERSION.match(target.name):
            shutil.rmtree(target, ignore_errors=True)
    elif path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def remove_leftovers(folder: Path) -> None:
    """Remove the versioned folders in `folder` that no link points to (previous versions, saves killed half-way)
    and temporary links (rank 0, while no save is in flight)."""
    if not folder.is_dir():
        return
    entries = list(folder.iterdir())
    for entry in entries:
        if entry.is_symlink() and TEMPORARY_LINK.match(entry.name):
            entry.unlink()
    linked = {os.readlink(entry) for entry in entries if entry.is_symlink() and not TEMPORARY_LINK.match(entry.name)}
    for entry in entries:
        if VERSION.match(entry.name) and entry.is_dir() and not entry.is_symlink() and entry.name not in linked:
            shutil.rmtree(entry, ignore_errors=True)


def _remove_if_rank_zero(rank: int, folder: Path | None) -> None:
    if rank == 0 and folder is not None:
        with contextlib.suppress(OSError):
            shutil.rmtree(folder, ignore_errors=True)


def _write_error(path: Path, error: BaseException) -> CheckpointWriteError:
    """The failure as `CheckpointWriteError`: the OS reason of the first process that failed, or what happened to
    the processes' coordination (a process died: "Connection closed by peer"; one stalled: gloo's timeout)."""
    if isinstance(error, CheckpointWriteError):
        return CheckpointWriteError(path, error.reason, error.errno)
    if isinstance(error, CheckpointException):
        rank, (cause, _) = min(error.failures.items())
        if isinstance(cause, OSError) and cause.strerror:
            return CheckpointWriteError(path, f"{cause.strerror}, on rank {rank}", cause.errno)
        return CheckpointWriteError(path, f"rank {rank}: {_first_line(cause)}")
    if isinstance(error, OSError) and error.strerror and not isinstance(error, dist.DistError):
        return CheckpointWriteError(path, error.strerror, error.errno)
    return CheckpointWriteError(path, f"another process of the run stopped or stalled during the save: "
                                      f"{_first_line(error)}")  # fmt: skip


def _first_line(error: BaseException) -> str:
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return re.sub(r"^\[[^\]]*\] ", "", line)  # gloo's "[../third_party/gloo/...:534] " prefix
