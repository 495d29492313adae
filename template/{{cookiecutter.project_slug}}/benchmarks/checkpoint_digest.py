"""What a checkpoint's digest costs: `python benchmarks/checkpoint_digest.py [--gb 1] [--rounds 3]`.

A checkpoint of `--gb` GB (float32 weights, and an optimizer moment for half of them) is written with the engine's
DurableCheckpointIO, then, in turns, `--rounds` times: serialised by torch.save into /dev/null through the file
wrapper that computes the digest as the bytes are written (durable.keeping_write_errors) and through a plain one (the
CPU a write costs the thread that writes; what a disk adds, fsync included, is the same for both), and read back: the
engine's check against the digest (resume/digests.verify), a whole-file CRC-32 and a SHA-256 of the same reads, and
torch.load (weights_only, to the CPU), which a resume or an evaluation does anyway. The file stays in the page cache
(a warm read, as right after a save; a cold read adds the disk's own time to each alike). Prints the best seconds per
GB of each, and the check's cost as a share of torch.load's.
"""

import argparse
import hashlib
import os
import tempfile
import time
import zlib
from pathlib import Path

import torch

from template_package.engine.resume import digests
from template_package.engine.resume.durable import DurableCheckpointIO, keeping_write_errors


def checkpoint_of(gigabytes: float) -> dict:
    """Weights in 64 MiB tensors, and two moments for a quarter of them (the rest of a file's size)."""
    count = max(1, round(gigabytes * 2**30 / 2**26 * 2 / 3))
    weights = {f"layer{i}.weight": torch.randn(2**24) for i in range(count)}
    moments = {i: {"exp_avg": torch.randn(2**24)} for i in range(count // 2)}
    return {"state_dict": weights, "optimizer_states": [{"state": moments, "param_groups": []}], "global_step": 1}


def whole_file(path: Path, digest) -> None:
    with open(path, "rb", buffering=0) as file:
        buffer = bytearray(1 << 23)
        while read := file.readinto(buffer):
            digest(memoryview(buffer)[:read])


def crc32(path: Path) -> None:
    crc = 0

    def add(data) -> None:
        nonlocal crc
        crc = zlib.crc32(data, crc)

    whole_file(path, add)


def sha256(path: Path) -> None:
    whole_file(path, hashlib.sha256().update)


def verify(path: Path) -> None:
    digests._INTACT.clear()  # (a check the process has made once is not made again: every round makes it anew)
    digests.verify(path)


def load(path: Path) -> None:
    torch.load(path, map_location="cpu", weights_only=True)


class PassThrough:
    """A file wrapper that only writes (what torch.save gets without the digest)."""

    def __init__(self, file) -> None:
        self.file = file

    def write(self, data) -> int:
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def serialise(checkpoint: dict, with_digest: bool) -> None:
    with open(os.devnull, "wb") as file:
        if not with_digest:
            torch.save(checkpoint, PassThrough(file))
            return
        with keeping_write_errors(file) as writer:
            torch.save(checkpoint, writer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=4)
    options = parser.parse_args()
    checkpoint = checkpoint_of(options.gb)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCHMARK_DIR")) as folder:
        path = Path(folder) / "last.ckpt"
        DurableCheckpointIO().save_checkpoint(checkpoint, path)
        writes = {"serialise (no digest)": lambda: serialise(checkpoint, False),
                  "serialise with the digest": lambda: serialise(checkpoint, True)}  # fmt: skip
        reads = {"the digest check (digests.verify)": verify, "CRC-32 of the file": crc32,
                 "SHA-256 of the file": sha256, "torch.load": load}  # fmt: skip
        best = dict.fromkeys([*writes, *reads], float("inf"))
        for _ in range(options.rounds):
            for name, write in writes.items():
                started = time.perf_counter()
                write()
                best[name] = min(best[name], time.perf_counter() - started)
            for name, read in reads.items():
                started = time.perf_counter()
                read(path)
                best[name] = min(best[name], time.perf_counter() - started)
        size = path.stat().st_size / 1e9
        print(f"a checkpoint of {size:.2f} GB, best of {options.rounds} rounds, warm page cache, {os.cpu_count()} CPUs")
        for name, seconds in best.items():
            print(f"{name:>40}: {seconds / size:.3f} s/GB")
        share = best["the digest check (digests.verify)"] / best["torch.load"]
        added = (best["serialise with the digest"] - best["serialise (no digest)"]) / size
        print(
            f"the check costs {share:.2f} of torch.load's time on a read; the digest adds {added:.3f} s/GB to the "
            "thread that writes"
        )


if __name__ == "__main__":
    main()
