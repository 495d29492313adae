"""A sampler or batch sampler of the user's own, read exactly: `DrawnOrderSampler` draws all it yields in an epoch
once, at the epoch's start, with the generators it draws from seeded from (seed, epoch), and is then read like the
engine's own shuffle (sampling.EpochShuffleSampler): each process its share of the epoch's global positions, a run
resumed anywhere on from the position where it stopped.

The generators seeded are torch's, Python's and NumPy's global ones and each CPU `torch.Generator` the sampler (or the
sampler a batch sampler holds) keeps as its `generator`, as RandomSampler, WeightedRandomSampler and
SubsetRandomSampler take one; all are put back after the draw, so its draws interleave with nothing else (the model's
dropout draws the same numbers with 0 loader workers as with 2). A sampler's `set_epoch` is called before each epoch
is drawn; one with `state_dict`/`load_state_dict` has its states at the epoch's start and end saved in every
checkpoint and put back on resume.

The engine cannot know that an order follows from (seed, epoch): a checkpoint holds a fingerprint of the positions
its epoch trained (`record`), and a resumed run draws that epoch again and compares (`matches`).

Depends on torch and numpy, and the engine's sampling.py.
"""

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch.utils.data import Sampler

from .sampling import EpochShuffleSampler, seed_generators, seed_of

KEY = "drawn_order"  # in a checkpoint: DrawnOrderSampler.record
SALT = 0x5EED  # the sampler's seeds, apart from those of the samples (sampling.seed_of)


class DrawnOrderSampler(EpochShuffleSampler):
    """`source` (a sampler; with `batches`, a batch sampler whose items are lists of indices) drawn once an epoch from
    (seed, epoch); the other arguments are EpochShuffleSampler's, and its positions are `source`'s items."""

    def __init__(self, source: Sampler, seed: int, batch_size: int | None = None, num_replicas: int = 1, rank: int = 0,
                 with_epoch: bool = False, drop_last: bool = True, global_batch: int | None = None,
                 batches: bool = False) -> None:  # fmt: skip
        self.source, self.batches = source, batches
        self._drawn: tuple[int, list] | None = None  # (epoch, its order)
        self.states: dict[int, tuple[dict | None, dict | None]] = {}  # source's state at each epoch's start and end
        super().__init__(0, seed, batch_size, num_replicas, rank, with_epoch, True, drop_last, global_batch)

    def epoch_order(self) -> list:
        if self._drawn is None or self._drawn[0] != self.epoch:
            self._drawn = (self.epoch, self._draw())
            self._sized(len(self._drawn[1]))
        return self._drawn[1]

    def _draw(self) -> list:
        set_epoch = getattr(self.source, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        start = state_of(self.source)
        with seeded(seed_of(self.seed ^ SALT, self.epoch, 0), generators_of(self.source)):
            order = [list(batch) for batch in self.source] if self.batches else list(self.source)
        self.states[self.epoch] = (start, state_of(self.source))
        return order

    def __iter__(self) -> Iterator:
        self.epoch_order()
        return super().__iter__()

    def __len__(self) -> int:
        self.epoch_order()
        return super().__len__()

    def fingerprint(self, positions: int) -> str:
        """A hash of the first `positions` items of the current epoch's order."""
        return hashlib.blake2b(repr(self.epoch_order()[:positions]).encode(), digest_size=16).hexdigest()

    def record(self, positions: int) -> dict:
        """What a checkpoint taken after `positions` of the current epoch's positions holds (see `matches`)."""
        start, end = self.states.get(self.epoch, (None, None))
        return {"epoch": self.epoch, "positions": positions, "fingerprint": self.fingerprint(positions),
                "start": start, "end": end}  # fmt: skip

    def matches(self, record: dict) -> bool:
        """Whether the checkpoint's epoch, drawn again from the sampler's state at its start, begins with the positions
        the checkpoint trained. Called before the resumed run reads; a run that resumes in a later epoch goes on
        from the sampler's state at the checkpoint's epoch's end."""
        resumed_epoch = self.epoch
        if record["start"] is not None:
            self.source.load_state_dict(record["start"])
        self.epoch, self._drawn = record["epoch"], None
        same = self.fingerprint(record["positions"]) == record["fingerprint"]
        if resumed_epoch != record["epoch"]:
            if record["end"] is not None:
                self.source.load_state_dict(record["end"])
            self.epoch, self._drawn = resumed_epoch, None
        return same


def state_of(sampler: Sampler) -> dict | None:
    if callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None)):
        return sampler.state_dict()
    return None


def generators_of(sampler: Sampler) -> list[torch.Generator]:
    """The CPU torch generators a sampler keeps as its `generator`, and those of the samplers it holds."""
    found, objects = [], [sampler]
    for held in ("sampler", "batch_sampler"):
        if isinstance(getattr(sampler, held, None), Sampler):
            objects.append(getattr(sampler, held))
    for obj in objects:
        generator = getattr(obj, "generator", None)
        if isinstance(generator, torch.Generator) and generator.device.type == "cpu":
            found.append(generator)
    return found


@contextmanager
def seeded(seed: int, generators: list[torch.Generator]):
    """Torch's, Python's and NumPy's global generators and `generators` seeded from `seed`, all put back after."""
    states = torch.get_rng_state(), random.getstate(), np.random.get_state(), [g.get_state() for g in generators]
    try:
        seed_generators(seed)
        for offset, generator in enumerate(generators, start=1):
            generator.manual_seed(seed + offset)
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])
        for generator, state in zip(generators, states[3], strict=True):
            generator.set_state(state)
