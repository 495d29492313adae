"""What each training step reads, and how it is augmented: functions of (seed, epoch, sample index) alone, so that a
run resumed anywhere, or run with any number of loader workers or processes, reads and augments the same samples.

- `EpochShuffleSampler`: the order of an epoch, and each process's share of it.
- `SeededAugmentation`: a random transform drawn for each sample from its own (seed, epoch, index). Random transforms
  inside loader workers otherwise draw from one generator per worker, seeded once: a run resumed mid-epoch drew other
  crops and flips for the rest of that epoch, and a run with another `num_workers` other ones throughout.

Depends on torch only.
"""

from collections.abc import Callable

import torch
from torch.utils.data import Dataset, DistributedSampler


class EpochShuffleSampler(DistributedSampler):
    """Shuffles with a permutation that depends on (seed, epoch) alone, and gives each of `num_replicas` processes its
    own share of it: torch's DistributedSampler with drop_last, whose order is `torch.randperm` seeded with
    seed + epoch.

    Lightning calls `set_epoch` at every epoch start, after a resume too, so a run resumed at an epoch boundary
    shuffles like the run that never stopped; mid-epoch, StatefulDataLoader fast-forwards through the same
    permutation. torchdata's RandomSampler keeps a generator whose state at an epoch boundary is not restored: a run
    resumed there trained on a different order (measured in tests/test_resume.py). Being a DistributedSampler, it is
    used as is under DDP: Lightning would wrap any other sampler in its DistributedSamplerWrapper, which passes
    `set_epoch` to itself only, so every epoch replayed the first epoch's order (found by a 2-node run resumed at an
    epoch boundary, tests/test_scale_out.py).

    With `batch_size`, it yields whole batches of indices (the last partial one dropped) for a loader with
    `batch_size=None`: a TensorDataset then gathers a batch with one index operation per tensor. With
    `with_epoch`, it yields (epoch, index) pairs, the keys of a `SeededAugmentation`.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int,
        batch_size: int | None = None,
        num_replicas: int = 1,
        rank: int = 0,
        with_epoch: bool = False,
    ) -> None:
        super().__init__(range(num_samples), num_replicas, rank, shuffle=True, seed=seed, drop_last=True)
        self.batch_size, self.with_epoch = batch_size, with_epoch

    def __iter__(self):
        if self.batch_size is None:
            order = super().__iter__()
            return ((self.epoch, index) for index in order) if self.with_epoch else order
        order, size = list(super().__iter__()), self.batch_size
        return (order[i * size : (i + 1) * size] for i in range(len(self)))

    def __len__(self) -> int:
        return self.num_samples if self.batch_size is None else self.num_samples // self.batch_size


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A seed for one sample in one epoch (distinct for every (epoch, index) of a run of up to a million samples)."""
    return (seed * 1_000_003 + epoch * 1_000_000 + index) % 2**63


class SeededAugmentation(Dataset):
    """`dataset`'s samples (image, target) with `transform` applied to the image, its random draws seeded by
    (seed, epoch, index): keys are the (epoch, index) pairs of an `EpochShuffleSampler(with_epoch=True)`.

    The transform draws from torch's global generator (torchvision's random transforms take no generator); it is
    seeded for the one sample and restored after, so nothing else in the process sees a difference.
    """

    def __init__(self, dataset: Dataset, transform: Callable, seed: int) -> None:
        self.dataset, self.transform, self.seed = dataset, transform, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        image, target = self.dataset[index]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(sample_seed(self.seed, epoch, index))
            return self.transform(image), target
