"""What the engine costs a train loader with a sampler of the user's own: `python benchmarks/samplers.py [--workers N]
[--samples N] [--repeats N]`.

Reads epochs of a map-style dataset (a small image and a class per sample, noise drawn in `__getitem__`), batches
only, no model, through the user's loader alone and through the engine's rebuild of it (data/loaders.resumable_loader:
a StatefulDataLoader, a DrawnOrderSampler over the user's sampler, SeededSamples), one epoch of each per repeat,
interleaved. For a WeightedRandomSampler and a length-bucketing batch sampler (tests/helpers/sampled_data.py), prints
each side's samples/s (median) and `ratio <x>`: the median of own/engine time per epoch, with its spread (the goal:
>= 0.98); and the same against the engine's rebuild of a `shuffle=True` loader of the same samples, which seeds each
sample's draws as well: what drawing the user's sampler adds.

Then what the engine adds once an epoch and once a checkpoint, for a large sampler: drawing a WeightedRandomSampler's
epoch of a million samples (the engine's draw against the sampler's own iteration) and the fingerprint of half of it
that a checkpoint holds.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset, WeightedRandomSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from template_package.engine.data.drawn_order import DrawnOrderSampler  # noqa: E402
from template_package.engine.data.loaders import resumable_loader  # noqa: E402

from helpers.sampled_data import BucketBatches  # noqa: E402


class NoisyImages(Dataset):
    """`n` 1x8x8 images with a class each; noise drawn per sample, as an augmentation does."""

    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.images, self.targets = torch.rand(n, 1, 8, 8, generator=generator), torch.arange(n) % 10

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int):
        return self.images[index] + 0.1 * torch.randn(1, 8, 8), self.targets[index]


def user_loader(kind: str, dataset: NoisyImages, workers: int) -> DataLoader:
    if kind == "weighted":
        weights = 1.0 + (dataset.targets < 5).double() * 3  # an imbalance to correct
        sampler = WeightedRandomSampler(weights, len(dataset))
        return DataLoader(dataset, batch_size=64, sampler=sampler, drop_last=True, num_workers=workers)
    lengths = [(7 * i) % 23 for i in range(len(dataset))]
    return DataLoader(dataset, batch_sampler=BucketBatches(lengths, 64, bucket=1000), num_workers=workers)


def epoch_seconds(loader, epoch: int) -> tuple[float, int]:
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    start, samples = time.perf_counter(), 0
    for _, targets in loader:
        samples += len(targets)
    return time.perf_counter() - start, samples


def compare(kind: str, args) -> None:
    dataset = NoisyImages(args.samples)
    own = user_loader(kind, dataset, args.workers)
    engine = resumable_loader(user_loader(kind, dataset, args.workers), seed=42, epoch=0)
    # The engine's own shuffle of the same samples: what drawing the user's sampler adds beyond it.
    shuffled = resumable_loader(DataLoader(dataset, batch_size=64, shuffle=True, drop_last=True,
                                           num_workers=args.workers), seed=42, epoch=0)  # fmt: skip
    loaders = {"own": own, "engine": engine, "engine_shuffle": shuffled}
    for loader in loaders.values():
        epoch_seconds(loader, 0)  # warm-up
    per_sample = {name: [] for name in loaders}
    for repeat in range(1, args.repeats + 1):
        for name, loader in loaders.items():
            seconds, samples = epoch_seconds(loader, repeat)
            per_sample[name].append(seconds / samples)
    ratio = [own / engine for own, engine in zip(per_sample["own"], per_sample["engine"], strict=True)]
    drawn = [shuffle / engine for shuffle, engine in zip(per_sample["engine_shuffle"], per_sample["engine"],
                                                         strict=True)]  # fmt: skip
    rate = {name: 1 / statistics.median(times) for name, times in per_sample.items()}
    print(f"{kind}, {args.workers} workers, {args.samples} samples, {args.repeats} repeats: own loader "
          f"{rate['own']:.0f} samples/s, engine {rate['engine']:.0f} samples/s; ratio {statistics.median(ratio):.3f} "
          f"(spread {min(ratio):.3f}-{max(ratio):.3f}); against the engine's own shuffle of the same samples "
          f"{statistics.median(drawn):.3f} (spread {min(drawn):.3f}-{max(drawn):.3f})")  # fmt: skip


def draw_costs(args) -> None:
    n = 1_000_000
    weights = torch.rand(n, generator=torch.Generator().manual_seed(0))
    sampler = WeightedRandomSampler(weights, n)
    own, drawn, fingerprints = [], [], []
    for epoch in range(args.repeats):
        start = time.perf_counter()
        list(sampler)
        own.append(time.perf_counter() - start)
        engine = DrawnOrderSampler(sampler, seed=42)
        engine.set_epoch(epoch)
        start = time.perf_counter()
        engine.epoch_order()
        drawn.append(time.perf_counter() - start)
        start = time.perf_counter()
        engine.fingerprint(n // 2)
        fingerprints.append(time.perf_counter() - start)
    print(f"a WeightedRandomSampler epoch of {n} samples: its own iteration {statistics.median(own) * 1e3:.0f} ms, "
          f"the engine's draw {statistics.median(drawn) * 1e3:.0f} ms (once an epoch); a checkpoint's fingerprint "
          f"of {n // 2} positions {statistics.median(fingerprints) * 1e3:.0f} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for kind in ("weighted", "bucketing"):
        compare(kind, args)
    draw_costs(args)


if __name__ == "__main__":
    main()
