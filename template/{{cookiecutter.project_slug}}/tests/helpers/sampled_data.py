"""The stand-in's data read through samplers real teams use, each written as a user would: a WeightedRandomSampler
that rebalances an imbalanced set, a length-bucketing batch sampler of one's own with `set_epoch`, and a sampler whose
order is not a function of the seed and the epoch (it draws from the operating system); and a dataset with batched
reads (`__getitems__`)."""

import os
import random

import torch
from torch.utils.data import DataLoader, Sampler, WeightedRandomSampler

from helpers.stand_in import Noisy, StandInData, synthetic_images


class WeightedData(StandInData):
    """Classes 0-4 kept at a quarter of their samples (an imbalanced set), rebalanced by a WeightedRandomSampler that
    draws with replacement; the images get noise drawn per sample (`augment`)."""

    def __init__(self, batch_size: int = 32, num_workers: int = 0, drop_last: bool = True) -> None:
        super().__init__(batch_size, num_workers)
        self.drop_last = drop_last

    def setup(self, stage: str) -> None:
        if self.splits:
            return
        self.splits = synthetic_images()
        images, targets = self.splits["train"].tensors
        keep = (targets >= 5) | (torch.arange(len(targets)) % 4 == 0)
        self.splits["train"] = Noisy(torch.utils.data.TensorDataset(images[keep], targets[keep]))
        counts = torch.bincount(targets[keep], minlength=10).double()
        self.weights = (1 / counts)[targets[keep]]

    def train_dataloader(self) -> DataLoader:
        sampler = WeightedRandomSampler(self.weights, num_samples=len(self.weights), replacement=True)
        return DataLoader(self.splits["train"], batch_size=self.hparams.batch_size, sampler=sampler,
                          drop_last=self.drop_last, num_workers=self.hparams.num_workers)  # fmt: skip


class BucketBatches(Sampler):
    """Batches of samples of similar length: the indices shuffled with a generator seeded from (seed, epoch), cut
    into buckets of `bucket` samples, each sorted by length and batched; the batches shuffled. Batches of
    `batch_size`, a bucket's last one smaller."""

    def __init__(self, lengths: list[int], batch_size: int, bucket: int = 100, seed: int = 0) -> None:
        self.lengths, self.batch_size, self.bucket, self.seed, self.epoch = lengths, batch_size, bucket, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        batches = []
        for start in range(0, len(order), self.bucket):
            bucket = sorted(order[start : start + self.bucket], key=self.lengths.__getitem__)
            batches += [bucket[i : i + self.batch_size] for i in range(0, len(bucket), self.batch_size)]
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]

    def __iter__(self):
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


class BucketedData(StandInData):
    """The stand-in's images with a made-up length each, read by BucketBatches (a batch sampler of its own)."""

    def __init__(self, batch_size: int = 32, num_workers: int = 0) -> None:
        super().__init__(batch_size, num_workers)

    def setup(self, stage: str) -> None:
        if not self.splits:
            self.splits = synthetic_images()
            self.splits["train"] = Noisy(self.splits["train"])

    def train_dataloader(self) -> DataLoader:
        train = self.splits["train"]
        lengths = [(7 * i) % 23 for i in range(len(train))]
        batches = BucketBatches(lengths, self.hparams.batch_size)
        return DataLoader(train, batch_sampler=batches, num_workers=self.hparams.num_workers)


class SystemRandomSampler(Sampler):
    """A shuffle seeded from the operating system: its order is not a function of the seed and the epoch."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self):
        order = list(range(self.size))
        random.Random(os.urandom(8)).shuffle(order)
        return iter(order)

    def __len__(self) -> int:
        return self.size


class SystemRandomData(StandInData):
    def train_dataloader(self) -> DataLoader:
        train = self.splits["train"]
        return DataLoader(train, batch_size=self.hparams.batch_size, sampler=SystemRandomSampler(len(train)))


class NoisyBatches(Noisy):
    """Noisy's samples read a batch at a time (`__getitems__`), the noise drawn once for the whole batch."""

    def __getitems__(self, indices: list[int]) -> list:
        images, targets = self.dataset[indices]
        noisy = images + 0.1 * torch.randn(images.shape)
        return list(zip(noisy, targets, strict=True))


class BatchReadData(StandInData):
    def setup(self, stage: str) -> None:
        if not self.splits:
            self.splits = synthetic_images()
            self.splits["train"] = NoisyBatches(self.splits["train"])
