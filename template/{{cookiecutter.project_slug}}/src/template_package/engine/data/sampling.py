"""What each training step reads, and the random draws made for each sample: functions of (seed, epoch, sample index)
alone, so that a run resumed anywhere, or run with any number of loader workers or processes, reads the same samples
and draws the same random numbers for them.

- `EpochShuffleSampler`: the order of an epoch, and each process's share of it.
- `SeededSamples`: a dataset's samples, each read with torch's, Python's and NumPy's global generators seeded from
  its own (seed, epoch, index). Random draws inside loader workers otherwise come from one generator per worker,
  seeded once: a run resumed mid-epoch drew other crops, offsets or noise for the rest of that epoch, and a run with
  another `num_workers` other ones throughout. `sample_seed()` gives the seed itself, for a generator of your own
  (`np.random.default_rng(sample_seed())`).

Depends on torch and numpy only.
"""

import contextlib
import contextvars
import random
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, Subset


class EpochShuffleSampler(DistributedSampler):
    """Shuffles with a permutation that depends on (seed, epoch) alone, and gives each of `num_replicas` processes its
    own share of it: torch's DistributedSampler with drop_last, whose order is `torch.randperm` seeded with
    seed + epoch (`shuffle=False`: the dataset's order). Rank r reads the global positions r, r + W, r + 2W, ... of
    that order, so that with b samples a batch and a batches accumulated, optimizer step s reads positions
    [s * G, (s + 1) * G) of it, G = W * b * a, whatever W, b and a are: the order is one of global positions, and a
    run resumed on another number of processes reads on from where it stopped (`resume_at`).

    Lightning calls `set_epoch` at every epoch start, after a resume too, so a run resumed at an epoch boundary
    shuffles like the run that never stopped; mid-epoch, StatefulDataLoader fast-forwards through the same
    permutation. torchdata's RandomSampler keeps a generator whose state at an epoch boundary is not restored: a run
    resumed there trained on a different order (tests/test_resume.py). Being a DistributedSampler, it is
    used as is under DDP: Lightning would wrap any other sampler in its DistributedSamplerWrapper, which passes
    `set_epoch` to itself only, so every epoch would replay the first epoch's order (tests/test_scale_out.py).

    With `batch_size`, it yields whole batches of indices (the last partial one dropped with `drop_last`) for a
    loader with `batch_size=None`: a TensorDataset then gathers a batch with one index operation per tensor. With
    `with_epoch`, it yields (epoch, index, global position) keys, those of `SeededSamples`. With `global_batch` (G),
    an epoch is the whole global batches of the order, the last N mod G samples left out: no optimizer step of a
    partial accumulation window, and epochs of the same samples on any number of processes.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int,
        batch_size: int | None = None,
        num_replicas: int = 1,
        rank: int = 0,
        with_epoch: bool = False,
        shuffle: bool = True,
        drop_last: bool = True,
        global_batch: int | None = None,
    ) -> None:
        super().__init__(range(num_samples), num_replicas, rank, shuffle=shuffle, seed=seed, drop_last=True)
        self.batch_size, self.with_epoch, self.drop_last_batch = batch_size, with_epoch, drop_last
        if global_batch is not None and global_batch % num_replicas:
            raise ValueError(f"global_batch={global_batch} is not a multiple of the {num_replicas} processes")
        self.global_batch = global_batch
        self._sized(num_samples)
        self._resume: tuple[int, int] | None = None  # (epoch, global position) to read on from

    def _sized(self, positions: int) -> None:
        """An epoch of `positions` read as whole global batches (or whole rounds of the processes)."""
        unit = self.global_batch or self.num_replicas
        self.total_size = positions // unit * unit
        self.num_samples = self.total_size // self.num_replicas

    def resume_at(self, epoch: int, position: int) -> None:
        """Read `epoch` from global position `position` on (a multiple of the number of processes): the samples
        after those every process read before a run on another number of processes was stopped. The epoch's length
        stays the whole epoch's, which Lightning compares with the batches it counts as done."""
        if position % self.num_replicas:
            raise ValueError(f"position {position} is not a multiple of the {self.num_replicas} processes")
        self._resume = (epoch, position)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if self._resume is not None and self._resume[0] != epoch:
            self._resume = None

    def epoch_order(self) -> list:
        """The epoch's global order: DistributedSampler's permutation, seeded with seed + epoch."""
        if not self.shuffle:
            return list(range(len(self.dataset)))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.dataset), generator=generator).tolist()

    def _start(self) -> int:
        """The global position this rank reads on from (the resume position, in the resumed epoch), plus its rank."""
        return (self._resume[1] if self._resume is not None and self._resume[0] == self.epoch else 0) + self.rank

    def _indices(self) -> list:
        """This rank's share of the epoch's order (DistributedSampler's, from the resume position on)."""
        return self.epoch_order()[self._start() : self.total_size : self.num_replicas]

    def __iter__(self) -> Iterator:
        order = self._indices()
        if self.batch_size is None and self.with_epoch:  # SeededSamples' keys
            positions = range(self._start(), self.total_size, self.num_replicas)
            return ((self.epoch, index, position) for index, position in zip(order, positions, strict=True))
        if self.batch_size is None:
            return iter(order)
        size = self.batch_size
        batches = len(order) // size + (len(order) % size > 0 and not self.drop_last_batch)
        return (order[i * size : (i + 1) * size] for i in range(batches))

    def __len__(self) -> int:
        if self.batch_size is None:
            return self.num_samples
        whole, rest = divmod(self.num_samples, self.batch_size)
        return whole + (rest > 0 and not self.drop_last_batch)


def seed_of(seed: int, epoch: int, index: int) -> int:
    """A seed for one sample in one epoch (distinct for every (epoch, index) of a run of up to a million samples)."""
    return (seed * 1_000_003 + epoch * 1_000_000 + index) % 2**63


_SAMPLE_SEED: contextvars.ContextVar[int] = contextvars.ContextVar("sample_seed")


def sample_seed() -> int:
    """The seed of the sample being read, inside a `SeededSamples` dataset (the engine's train loader reads every
    map-style dataset through one): for a generator of your own, e.g. `np.random.default_rng(sample_seed())`."""
    try:
        return _SAMPLE_SEED.get()
    except LookupError:
        raise RuntimeError(
            "sample_seed() is known only while the engine's train loader reads a sample (SeededSamples)"
        ) from None


class SeededSamples(Dataset):
    """`dataset`'s samples, each read with torch's (CPU), Python's and NumPy's global generators seeded from
    (seed, epoch, index): keys are the (epoch, index, global position) of an `EpochShuffleSampler(with_epoch=True)`.
    A dataset with `__getitems__` (batched reads, as Hugging Face datasets have) is read a batch at a time, seeded from
    (seed, epoch, the batch's first global position). Other attributes are the dataset's
    (`trainer.train_dataloader.dataset.vocab`).

    Torchvision's random transforms, `torch.randint`, `random.random()` and `np.random.rand()` in `__getitem__` then
    draw the same numbers for a sample whether it is read in the main process or a worker, in a run that never stopped
    or one resumed anywhere. A worker process draws from them for nothing else. In the main process (num_workers 0)
    all three are restored after each batch (`__getitems__`, which torch's loader calls with a batch's keys), so the
    model's own draws (dropout, `np.random` in a step) and the generator states a checkpoint saves are those of a run
    with workers. Restoring per batch, not per sample: saving and restoring NumPy's state costs more than the seeding
    itself (benchmarks/feature_costs.py prints the costs).
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __getattr__(self, name: str):
        if name == "dataset":  # (not set yet: while unpickled in a loader worker)
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int | list[int], int]):
        """One sample, or with a list of indices (a batch sampler's batch, at one position) the list of its samples."""
        epoch, index, position = key
        if isinstance(index, list):
            return self.__getitems__([(epoch, i, position) for i in index])
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list[tuple[int, int, int]]) -> list:
        read = self._read_batch if reads_batches(self.dataset) else self._read_each
        if torch.utils.data.get_worker_info() is not None:
            return read(keys)
        states = torch.get_rng_state(), random.getstate(), np.random.get_state()
        try:
            return read(keys)
        finally:
            torch.set_rng_state(states[0])
            random.setstate(states[1])
            np.random.set_state(states[2])

    def _read_each(self, keys: list[tuple[int, int, int]]) -> list:
        return [self._read(key) for key in keys]

    def _read(self, key: tuple[int, int, int]):
        epoch, index, _ = key
        with drawing_from(seed_of(self.seed, epoch, index)):
            return self.dataset[index]

    def _read_batch(self, keys: list[tuple[int, int, int]]) -> list:
        epoch, _, position = keys[0]
        with drawing_from(seed_of(self.seed, epoch, position)):
            return self.dataset.__getitems__([index for _, index, _ in keys])


def reads_batches(dataset: Dataset) -> bool:
    """Whether `dataset` has batched reads of its own (`__getitems__`; torch's Subset forwards its dataset's)."""
    if isinstance(dataset, Subset):
        return reads_batches(dataset.dataset)
    return callable(getattr(dataset, "__getitems__", None))


@contextlib.contextmanager
def drawing_from(seed: int):
    """The global generators seeded from `seed`, which `sample_seed()` gives meanwhile."""
    seed_generators(seed)
    token = _SAMPLE_SEED.set(seed)
    try:
        yield
    finally:
        _SAMPLE_SEED.reset(token)


def seed_generators(seed: int) -> None:
    """Torch's CPU generator, Python's, NumPy's: torch.manual_seed would also seed every accelerator, a cost this
    call, made for every sample, does not need."""
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
