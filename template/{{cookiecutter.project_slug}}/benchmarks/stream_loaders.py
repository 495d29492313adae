"""What the engine's streaming train loader costs: `python benchmarks/stream_loaders.py [--library
datasets|litdata|webdataset|mosaic] [--workers N] [--ddp]`.

Reads a stream of locally generated samples (JSON lines shards for Hugging Face `datasets` streaming with a seeded
shuffle buffer, chunks built by `litdata.optimize` for litdata's StreamingDataset with shuffle, tar shards for a seeded
WebDataset pipeline, MDS shards for MosaicML's shuffled StreamingDataset), batches only, no model: the library's own
loader alone (the epoch set as its documentation shows) and the same loader as the engine wraps it
(engine/data/streams.ResumableStream), epoch by epoch, interleaved (one of each per repeat) so that machine noise hits
both alike. Prints each side's batches/s (median over repeats) and `ratio <x>`, the median of own/wrapped time per
epoch: the wrapper's batches/s as a share of the library's (the goal: >= 0.98); and the same ratio of the CPU time each
epoch took in this process and its workers, which other processes on a shared machine do not blur.

Then what a resume's skip costs: a stream resumed half-way through an epoch re-reads that epoch's first half and drops
it. Printed: the time to the first batch after the skip, per sample skipped, beside the time to read a sample.

--ddp: what agreeing on equal steps costs under 2 processes (gloo, CPU): the time the training loop waits for each
batch of a loader without a length, for which the wrapper all-reduces "I have a batch", back to back and with a
simulated training step (--step-ms) during which the all-reduce runs.
"""

import argparse
import gc
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from template_package.engine.data.preparing import prepare_keeping_global_state  # noqa: E402
from template_package.engine.data.streams import ResumableStream  # noqa: E402

from helpers.mosaic_task import MosaicData  # noqa: E402
from helpers.stream_task import HFStreamData, LitStreamData  # noqa: E402
from helpers.webdataset_task import WebDatasetData  # noqa: E402


def fit_loop(epoch: int, trained: int = 0) -> SimpleNamespace:
    """The two counters of Lightning's fit loop that a ResumableStream reads."""
    batches = SimpleNamespace(batch_progress=SimpleNamespace(current=SimpleNamespace(processed=trained)))
    return SimpleNamespace(epoch_progress=SimpleNamespace(current=SimpleNamespace(processed=epoch)), epoch_loop=batches)


def build_loader(args, folder: Path):
    if args.library == "datasets":
        shards = (args.samples // 8,) * 8
        module = HFStreamData(str(folder / "json"), shard_sizes=shards, batch_size=args.batch_size,
                              num_workers=args.workers, buffer_size=1000)  # fmt: skip
    elif args.library == "litdata":
        module = LitStreamData(str(folder / "chunks"), samples=args.samples, batch_size=args.batch_size,
                               num_workers=args.workers)  # fmt: skip
    elif args.library == "webdataset":
        module = WebDatasetData(str(folder / "tars"), samples=args.samples, batch_size=args.batch_size,
                                num_workers=args.workers)  # fmt: skip
    else:
        module = MosaicData(str(folder / "mds"), samples=args.samples, batch_size=args.batch_size,
                            num_workers=args.workers)  # fmt: skip
    prepare_keeping_global_state(module)
    return module.train_dataloader()


def own_epoch(loader, epoch: int, library: str) -> int:
    """One epoch of the library's own loader, its epoch set the way its documentation shows."""
    if library == "datasets":
        loader.dataset.set_epoch(epoch)  # (litdata's, WebDataset's and MosaicML's loaders need nothing)
    return sum(1 for _ in loader)


def wrapped_epoch(stream: ResumableStream, epoch: int) -> int:
    stream.fit_loop.epoch_progress.current.processed = epoch
    return sum(1 for _ in stream)


def cpu_seconds() -> float:
    """CPU time of this process and of its ended children (the loader's workers, once an epoch has ended)."""
    gc.collect()  # (an epoch's iterator, and with it its workers, ends when collected)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def timed(read) -> tuple[float, float, int]:
    """Wall-clock and CPU seconds of `read()`, and what it returned."""
    start, cpu = time.perf_counter(), cpu_seconds()
    batches = read()
    return time.perf_counter() - start, cpu_seconds() - cpu, batches


def compare(args, folder: Path) -> None:
    own, stream = build_loader(args, folder), ResumableStream(build_loader(args, folder), 42, fit_loop(0))
    own_epoch(own, 0, args.library), wrapped_epoch(stream, 0)  # warm-up: caches, imports in workers
    rates, wall_ratios, cpu_ratios = {"own": [], "wrapped": []}, [], []
    for repeat in range(1, args.repeats + 1):
        own_wall, own_cpu, own_batches = timed(lambda: own_epoch(own, repeat, args.library))  # noqa: B023
        wall, cpu, batches = timed(lambda: wrapped_epoch(stream, repeat))  # noqa: B023
        assert own_batches == batches, (own_batches, batches)
        rates["own"].append(own_batches / own_wall)
        rates["wrapped"].append(batches / wall)
        wall_ratios.append(own_wall / wall)
        cpu_ratios.append(own_cpu / cpu)
    print(f"{args.library}, {args.workers} workers, {args.samples} samples in batches of {args.batch_size}, "
          f"{args.repeats} repeats: own loader {statistics.median(rates['own']):.1f} batches/s, wrapped "
          f"{statistics.median(rates['wrapped']):.1f} batches/s")  # fmt: skip
    print(f"ratio {statistics.median(wall_ratios):.3f} (wall clock, spread {min(wall_ratios):.3f}-"
          f"{max(wall_ratios):.3f}); CPU time: {statistics.median(cpu_ratios):.3f} (spread {min(cpu_ratios):.3f}-"
          f"{max(cpu_ratios):.3f})")  # fmt: skip

    # What the wrapper adds to each batch, alone: the generator its batches pass through (ResumableStream._skip, which
    # hands on every batch after the skipped ones), timed on a stream that costs nothing to read.
    items, own_times, wrapped_times = 1_000_000, [], []
    for _ in range(args.repeats):
        own_times.append(timed(lambda: sum(1 for _ in iter(range(items))))[0])  # noqa: B023
        wrapped_times.append(timed(lambda: sum(1 for _ in stream._skip(iter(range(items)), 0)))[0])  # noqa: B023
    print(f"the wrapper's own cost: {(min(wrapped_times) - min(own_times)) / items * 1e6:.3f} us a batch")

    # The skip: resumed half-way through epoch 1, versus reading epoch 1 from its start.
    half = wrapped_epoch(stream, 1) // 2
    skips = []
    for _ in range(args.repeats):
        resumed = ResumableStream(build_loader(args, folder), 42, fit_loop(1))
        resumed.load_state_dict({"epoch": 1, "trained": half, "num_workers": args.workers, "world_size": 1})
        skip = timed(lambda: next(iter(resumed)))[0]  # noqa: B023
        read = timed(lambda: next(iter(stream)))[0]
        skips.append(skip - read)  # (both start the epoch's workers and read its first batch)
    per_sample = statistics.median(skips) / (half * args.batch_size)
    read_per_sample = 1 / (statistics.median(rates["own"]) * args.batch_size)
    print(f"skip cost {per_sample * 1e6:.1f} us a sample skipped ({half} batches skipped); reading one costs "
          f"{read_per_sample * 1e6:.1f} us")  # fmt: skip


class Counting(torch.utils.data.IterableDataset):
    """0, 1, ..., n - 1: a stream without a length that costs nothing to read."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def all_reduce_cost(rank: int, rendezvous: str, batches: int, step_ms: float) -> None:
    """Per batch, the time the training loop waits for its next batch from a stream read by 2 processes that agree on
    equal steps, minus the same read by one, with a `step_ms` "training step" (a sleep) between batches."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    loader = torch.utils.data.DataLoader(Counting(batches), batch_size=None)

    def waited(stream: ResumableStream) -> float:
        seconds, batches = 0.0, iter(stream)
        while True:
            start = time.perf_counter()
            if next(batches, None) is None:
                return seconds
            seconds += time.perf_counter() - start
            time.sleep(step_ms / 1000)

    times = {}
    for world_size in (1, 2) * 3:
        stream = ResumableStream(loader, 42, fit_loop(0), rank, world_size, torch.distributed.group.WORLD)
        times.setdefault(world_size, []).append(waited(stream) / batches)
    if rank == 0:
        cost = statistics.median(times[2]) - statistics.median(times[1])
        print(f"ddp: {cost * 1e6:.0f} us a batch waited for to agree on equal steps (2 processes, gloo, CPU), with "
              f"{step_ms} ms steps")  # fmt: skip
    torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", choices=["datasets", "litdata", "webdataset", "mosaic"], default="datasets")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8_000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--ddp", action="store_true")
    parser.add_argument("--step-ms", type=float, default=5.0, help="--ddp: the simulated training step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        if args.ddp:
            for step_ms in (0.0, args.step_ms):
                rendezvous = f"{folder}/rendezvous-{step_ms}"
                torch.multiprocessing.spawn(all_reduce_cost, args=(rendezvous, 1000, step_ms), nprocs=2)
        else:
            compare(args, Path(folder))


if __name__ == "__main__":
    main()
