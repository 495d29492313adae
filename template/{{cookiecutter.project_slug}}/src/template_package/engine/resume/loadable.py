"""A checkpoint is known to load when it is written: a resume reads it with `torch.load(weights_only=True)`, which
refuses any object that is not a tensor, a number, a string or a container of them (an `nn.Module`, a
`functools.partial` as Hydra's `_partial_: true` makes, a class, an OmegaConf container), so a checkpoint holding one
is found unusable only at the resume, after the run that wrote it is gone.

OmegaConf's containers (Hydra's configs) are stored as the plain dicts and lists they hold; anything else that would
not load stops the run in one line, at its start for a module's or DataModule's hyperparameters and at its first save
for the rest, naming what holds it and what to do. torch's `get_unsafe_globals_in_checkpoint` is the check, run on the
checkpoint with its tensors left out (they always load). Depends on torch and the engine's errors.py.
"""

import io

import torch

from ..errors import UsageError

HYPERPARAMETERS = ("hyper_parameters", "datamodule_hyper_parameters")


def plain(value):
    """`value` with every OmegaConf container in it turned into the dicts and lists it holds."""
    if type(value).__module__.split(".")[0] == "omegaconf":
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    if type(value) is dict:
        return {key: plain(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(plain(item) for item in value)
    return value


def store_plain(checkpoint: dict) -> None:
    """The checkpoint's hyperparameters stored as plain values (Lightning stores an OmegaConf container as it is, with
    its class under `hparams_type`, which weights-only loading refuses)."""
    for key in HYPERPARAMETERS:
        if key in checkpoint:
            checkpoint[key] = plain(dict(checkpoint[key]))
    checkpoint.pop("hparams_type", None)
    checkpoint.pop("datamodule_hparams_type", None)


def unsafe_globals(value) -> list[str]:
    """The classes and functions weights-only loading would refuse in `value` (its tensors left out)."""
    buffer = io.BytesIO()
    torch.save(_without_tensors(value), buffer)
    buffer.seek(0)
    return torch.serialization.get_unsafe_globals_in_checkpoint(buffer)


def _without_tensors(value):
    if isinstance(value, torch.Tensor):
        return None
    if isinstance(value, dict):
        return {key: _without_tensors(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_tensors(item) for item in value]
    return value


def check_hyperparameters(owners: list) -> None:
    """Stop in one line when a module's or DataModule's hyperparameters would not load back (see the module
    docstring)."""
    for owner in owners:
        if owner is None or not owner.hparams:
            continue
        found = [name for name, value in dict(owner.hparams).items() if unsafe_globals(plain(value))]
        if found:
            held = ", ".join(f"{name} (a {type(owner.hparams[name]).__qualname__})" for name in found)
            raise UsageError(
                f"{type(owner).__name__}'s hyperparameters {held} would not load from its checkpoints (a resume loads "
                f"them with weights_only=True, which takes numbers, strings, lists and dicts): leave them out with "
                f"self.save_hyperparameters(ignore={found}) and keep them as attributes (self.{found[0]} = "
                f"{found[0]}, read where self.hparams.{found[0]} was), the config building them again, or give plain "
                "values"
            )


def check_loadable(checkpoint: dict, path) -> None:
    """Stop in one line when `checkpoint` (about to be written to `path`) holds anything weights-only loading refuses,
    naming its first level key and the classes."""
    found = {key: kinds for key, value in checkpoint.items() if (kinds := unsafe_globals(value))}
    if found:
        held = ", ".join(f"{key} holds {', '.join(kinds[:3])}" for key, kinds in found.items())
        raise UsageError(
            f"{path} would not load back (a resume loads it with weights_only=True, which takes tensors, numbers, "
            f"strings, lists and dicts): {held}; make the state_dict of what saves it return plain values"
        )
