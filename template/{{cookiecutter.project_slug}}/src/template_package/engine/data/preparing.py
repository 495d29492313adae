"""Preparing data does not change the run: a DataModule's `prepare_data` (downloading, building shards or chunks) runs
in the first run only, so whatever it does to the process would make the first run differ from every later one.

`litdata.optimize`, for one, seeds Python's, NumPy's and torch's global generators with 42 and switches the
multiprocessing start method to spawn: the first run would draw other dropout masks than a later one, and its loader
workers would start slowly (tests/test_streaming.py). The engine's Trainer runs `prepare_data` inside
`global_state_kept`. Depends on torch, numpy and lightning.
"""

import contextlib
import functools
import multiprocessing
import random

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden


@contextlib.contextmanager
def global_state_kept():
    """Leave the global random generators (torch's CPU and CUDA ones, Python's, NumPy's) and the multiprocessing start
    method as the block found them."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if multiprocessing.get_start_method(allow_none=True) != start_method:
            multiprocessing.set_start_method(start_method, force=True)


def prepare_keeping_global_state(owner: L.LightningModule | L.LightningDataModule) -> None:
    """`owner`'s own prepare_data, inside `global_state_kept`."""
    with global_state_kept():
        type(owner).prepare_data(owner)


def keep_global_state_in_prepare_data(owners: list) -> None:
    """For a fit: each owner (module, DataModule) that prepares data does it inside `global_state_kept`. An instance
    attribute Lightning calls as the hook, and which a spawned process (`ddp_spawn`) gets with the owner: a partial of
    a module's function pickles; `forget_prepare_data` removes it after the fit."""
    for owner in owners:
        if is_overridden("prepare_data", owner):
            owner.prepare_data = functools.partial(prepare_keeping_global_state, owner)


def forget_prepare_data(owners: list) -> None:
    for owner in owners:
        vars(owner).pop("prepare_data", None)
