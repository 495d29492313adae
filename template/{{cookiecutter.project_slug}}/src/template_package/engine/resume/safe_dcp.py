"""Reading a torch.distributed.checkpoint folder without running code it names: what `weights_only=True` is for
single files. DCP reads a folder's `.metadata` with `pickle.load` and its non-tensor entries (an optimizer's
param_groups) with `torch.load(weights_only=False)`: a crafted folder could run any code when it is loaded.

`SafeReader` unpickles `.metadata` allowing only the classes DCP writes there (its own dataclasses, torch.Size,
dtypes, layouts, a path); `SafePlanner` loads the non-tensor entries with `weights_only=True`. Anything else is
refused with pickle's UnpicklingError ("Unsupported global: ..."), as torch.load refuses a file. Tensors DCP always
reads with `weights_only=True`. Depends on torch only.
"""

import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.planner import ReadItem

from ..internals import _EmptyStateDictLoadPlanner, set_nested

# What DCP pickles into .metadata (torch 2.4 to 2.14), besides torch's dtypes.
ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # called with a layout's name, returns the layout
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),  # fmt: skip
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {module}.{name} in .metadata")


class SafeReader(FileSystemReader):
    """DCP's FileSystemReader, reading `.metadata` with the restricted unpickler."""

    def read_metadata(self, *args, **kwargs) -> dcp_metadata.Metadata:
        with (Path(self.path) / ".metadata").open("rb") as file:
            metadata = _MetadataUnpickler(file).load()
        if not isinstance(metadata, dcp_metadata.Metadata):
            raise pickle.UnpicklingError(f".metadata holds a {type(metadata).__name__}, not DCP's Metadata")
        if getattr(metadata, "storage_meta", None) is None:  # (as FileSystemReader.read_metadata does)
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(_EmptyStateDictLoadPlanner):
    """Rebuilds the whole state from .metadata (as dcp_to_torch_save does), non-tensor entries with
    `weights_only=True`."""

    def load_bytes(self, read_item: ReadItem, value) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_nested(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
