"""Preparing data does not change the run: a DataModule's `prepare_data` (downloading, building shards or chunks) runs
in the first run only, so whatever it does to the process would make the first run differ from every later one.

`litdata.optimize`, for one, seeds Python's, NumPy's and torch's global generators with 42 and switches the
multiprocessing start method to spawn: the first run would draw other dropout masks than a later one, and its loader
workers would start slowly (tests/test_streaming.py). The engine's Trainer runs `prepare_data` inside
`keeping_global_state`. Depends on torch and numpy.
"""

import functools
import multiprocessing
import random
from collections.abc import Callable

import numpy as np
import torch


def keeping_global_state(prepare: Callable[[], None]) -> Callable[[], None]:
    """`prepare`, leaving the global random generators (torch's CPU and CUDA ones, Python's, NumPy's) and the
    multiprocessing start method as it found them."""

    @functools.wraps(prepare)
    def prepare_keeping_global_state() -> None:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        states = torch.get_rng_state(), random.getstate(), np.random.get_state()
        start_method = multiprocessing.get_start_method(allow_none=True)
        try:
            prepare()
        finally:
            torch.set_rng_state(states[0])
            random.setstate(states[1])
            np.random.set_state(states[2])
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)
            if multiprocessing.get_start_method(allow_none=True) != start_method:
                multiprocessing.set_start_method(start_method, force=True)

    return prepare_keeping_global_state
