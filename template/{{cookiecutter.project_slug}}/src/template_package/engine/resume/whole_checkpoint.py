"""A checkpoint read whole, whatever its form: a single file, or a sharded folder (resume/sharded_folders.py: a DCP
folder or a link to one, written by any number of processes).

What reads a sharded checkpoint without the sharded strategy: validate, test and predict on one process or under
DDP (durable.DurableCheckpointIO.load_checkpoint), export, the CLI's checks (only meta.pt and the tensors' shapes,
from DCP's .metadata, without reading a shard), and the messages that say which step last.ckpt holds. A folder is
read whole into this process's memory, as the single file Lightning would have written: `state_dict` with whole
tensors, `optimizer_states` in torch.optim's own form (parameter numbers, not names), the rest from meta.pt. With
`weights_only` (the default) a folder is read as safely as torch.load reads a file (safe_dcp.py); the CLI checks every
sharded checkpoint this way before Lightning's own loading reads it.

Every read here checks the file against its digest first (digests.py): a single file whole, and of a sharded folder
its meta.pt, whose shard files carry no digest (DCP writes them; only their sizes are checked, `check_shard_files`).

Depends on torch, digests.py and safe_dcp.py.
"""

from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlanner

from ..internals import load_whole_state
from ..training.steps import steps_in
from .digests import verify
from .safe_dcp import SafePlanner, SafeReader

META = "meta.pt"  # Lightning's name for the non-tensor part of a sharded checkpoint


def is_sharded(path: str | Path) -> bool:
    """Whether `path` is a sharded checkpoint: a folder (or a link to one) with DCP's .metadata and meta.pt."""
    path = Path(path)
    return path.is_dir() and (path / ".metadata").is_file() and (path / META).is_file()


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a checkpoint file or a sharded checkpoint."""
    return Path(path).is_file() or is_sharded(path)


def saved_step(path: str | Path) -> int:
    """The training step a checkpoint holds (training/steps.py), reading as little as its form allows."""
    path = Path(path)
    file = path / META if path.is_dir() else path
    return steps_in(torch.load(file, map_location="cpu", weights_only=True, mmap=True))


def read_for_checks(path: str | Path, weights_only: bool = True) -> dict:
    """The checkpoint as torch.load returns a file, except for a sharded one whose `state_dict` holds tensors on the
    "meta" device: their shapes and dtypes, read from DCP's .metadata, and no values."""
    path = Path(path)
    verify(path / META if path.is_dir() else path)
    if not path.is_dir():
        return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=True)
    checkpoint = torch.load(path / META, map_location="cpu", weights_only=weights_only)
    metadata = _reader(path, weights_only).read_metadata()
    check_shard_files(path, metadata)
    if weights_only:  # the entries Lightning's own loading would unpickle (an optimizer's param_groups): tried here
        entries = {key for key, kind in metadata.state_dict_metadata.items() if isinstance(kind, BytesStorageMetadata)}
        _load({}, SafeReader(path), SafePlanner(keys=entries))
    checkpoint["state_dict"] = {}
    for key, stored in metadata.state_dict_metadata.items():
        section, *name = metadata.planner_data[key]
        if section == "state_dict" and isinstance(stored, TensorStorageMetadata):
            checkpoint["state_dict"][".".join(map(str, name))] = torch.empty(
                stored.size, dtype=stored.properties.dtype, device="meta"
            )
    return checkpoint


def check_shard_files(path: Path, metadata) -> None:
    """Raise FileNotFoundError or EOFError when a shard file that .metadata names is missing or shorter than what
    it should hold (a folder copied in part, a disk that lost a file)."""
    ends: dict[str, int] = {}
    for stored in metadata.storage_data.values():
        ends[stored.relative_path] = max(ends.get(stored.relative_path, 0), stored.offset + stored.length)
    for name, end in sorted(ends.items()):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{name} is missing")
        if (path / name).stat().st_size < end:
            raise EOFError(f"{name} is truncated")


def read_whole(path: str | Path, weights_only: bool = True) -> dict:
    """The checkpoint in this process's memory, a sharded one gathered into the form of a single file (see the
    module docstring). The whole model and optimizer state must fit in memory."""
    path = Path(path)
    verify(path / META if path.is_dir() else path)
    if not path.is_dir():
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    shards = read_shards(path, weights_only)
    checkpoint = torch.load(path / META, map_location="cpu", weights_only=weights_only)
    checkpoint["state_dict"] = shards.pop("state_dict")
    optimizers = sorted((key for key in shards if key.startswith("optimizer_")), key=lambda k: int(k.split("_")[1]))
    if optimizers:
        checkpoint["optimizer_states"] = [in_torch_optim_form(shards[key]) for key in optimizers]
    return checkpoint


def read_shards(path: str | Path, weights_only: bool = True) -> dict:
    """The tensors of a sharded checkpoint, whole, as DCP saved them: {"state_dict": ..., "optimizer_0": ...}, the
    optimizer states keyed by parameter names."""
    path, shards = Path(path), {}
    reader = _reader(path, weights_only)
    check_shard_files(path, reader.read_metadata())
    # What PyTorch's own dcp_to_torch_save does: rebuild the whole state from .metadata, without processes.
    _load(shards, reader, SafePlanner() if weights_only else None)
    return shards


def _load(state: dict, reader: FileSystemReader, planner: LoadPlanner | None) -> None:
    """DCP's load into `state` in this process alone; a failure raised as itself (an UnpicklingError, an OSError),
    not wrapped in DCP's CheckpointException."""
    try:
        load_whole_state(state, reader, planner)
    except CheckpointException as failed:
        raise next(iter(failed.failures.values()))[0] from None


def _reader(path: Path, weights_only: bool) -> FileSystemReader:
    return SafeReader(path) if weights_only else FileSystemReader(path)


def in_torch_optim_form(state: dict) -> dict:
    """An optimizer state keyed by parameter names (torch.distributed.checkpoint's) keyed by numbers instead, as
    `torch.optim.Optimizer.state_dict` numbers them: in the order of the parameter groups."""
    names = [str(name) for group in state["param_groups"] for name in group["params"]]
    number = {name: i for i, name in enumerate(names)}  # (as text: DCP stores numbered states' keys as text)
    groups = [{**group, "params": [number[str(name)] for name in group["params"]]} for group in state["param_groups"]]
    return {"state": {number[str(name)]: values for name, values in state["state"].items()}, "param_groups": groups}
