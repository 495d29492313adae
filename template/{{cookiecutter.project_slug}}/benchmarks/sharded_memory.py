"""What sharding saves and what its checkpoints cost: `python benchmarks/sharded_memory.py [--width 1024 --blocks 8]`.

A stack of MLP blocks (the shape of a transformer's, in an nn.ModuleList) trained one AdamW step, side by side: on one
process as DDP keeps it on every process, and sharded by the engine's rule (training/sharding.shard_by_rule, FSDP2
fully_shard) over W = 2 and 4 gloo processes on this machine's CPUs. Printed per process: the bytes of the
parameters, gradients and optimizer state each process holds after the step (the tensors' own bytes: on CPU the
allocator's figures would mix in torch's runtime), and their ratio to the unsharded process's (the goal: 1/W). Then
the time of a checkpoint save of the same state: one file from one process (durable.DurableCheckpointIO: temporary
file, fsync, rename) against the sharded folder every process writes (resume/sharded_folders.save: DCP, fsyncs, the
link swap), the median of `--saves` saves each.
"""

import argparse
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from template_package.engine.resume import sharded_folders
from template_package.engine.resume.durable import DurableCheckpointIO
from template_package.engine.training.sharding import shard_by_rule


class Blocks(nn.Module):
    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(blocks)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


class Model(nn.Module):
    """What a LightningModule holds: the network as a child (the rule shards each child with parameters)."""

    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = Blocks(width, blocks)


def local_bytes(tensors) -> int:
    """Bytes this process holds of `tensors`: a DTensor's local shard only."""
    total = 0
    for tensor in tensors:
        tensor = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += tensor.numel() * tensor.element_size()
    return total


def train_one_step(model: Model, width: int) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randn(8, width, generator=torch.Generator().manual_seed(dist.get_rank() if dist.is_initialized()
                                                                              else 0))  # fmt: skip
    model.net(inputs).square().mean().backward()
    optimizer.step()
    return optimizer


def held(model: Model, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    params = list(model.parameters())
    states = [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": local_bytes(params),
        "gradients": local_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": local_bytes(states),
    }


def sharded_worker(rank: int, world_size: int, port: int, args, folder: str, results) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    model = Model(args.width, args.blocks)
    shard_by_rule(model, mesh, MixedPrecisionPolicy())
    optimizer = train_one_step(model, args.width)
    bytes_held = held(model, optimizer)
    group = dist.new_group(backend="gloo")
    seconds = []
    for save in range(args.saves):
        shards = {"state_dict": get_model_state_dict(model), "optimizer_0": get_optimizer_state_dict(model, optimizer)}
        dist.barrier()
        start = time.perf_counter()
        sharded_folders.save(shards, {"global_step": save}, Path(folder) / "last.ckpt", group, FileSystemWriter)
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, bytes_held)
    if rank == 0:
        results.put((world_size, max(everyone, key=lambda b: sum(b.values())), statistics.median(seconds)))
    dist.destroy_process_group()


def unsharded(args, folder: str) -> tuple[dict[str, int], float]:
    model = Model(args.width, args.blocks)
    optimizer = train_one_step(model, args.width)
    seconds = []
    for _ in range(args.saves):
        start = time.perf_counter()
        state = {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()]}
        DurableCheckpointIO().save_checkpoint(state, Path(folder) / "last.ckpt")
        seconds.append(time.perf_counter() - start)
    return held(model, optimizer), statistics.median(seconds)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--world_sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--saves", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        alone, single_file = unsharded(args, folder)
    parameters = alone["parameters"] // 4
    print(f"{parameters / 1e6:.1f} M parameters (float32), AdamW, after one training step. Per process, MiB and the")
    print("share of the unsharded process's; the median time of a checkpoint save:")
    print(f"{'':>20}" + "".join(f"{name:>16}" for name in (*alone, "total")) + f"{'save':>10}")
    reference = [*alone.values(), sum(alone.values())]

    def print_row(name: str, row: list[int], seconds: float) -> None:
        cells = "".join(f"{b / 2**20:>9.1f}{b / a:>7.2f}" for b, a in zip(row, reference, strict=True))
        print(f"{name:>20}{cells}{seconds:>8.3f} s")

    print_row("unsharded, 1 file", reference, single_file)
    results = mp.get_context("spawn").Queue()
    for world_size in args.world_sizes:
        with tempfile.TemporaryDirectory() as folder:
            mp.spawn(sharded_worker, args=(world_size, free_port(), args, folder, results), nprocs=world_size)
        _, bytes_held, seconds = results.get()
        print_row(f"sharded over {world_size}", [*bytes_held.values(), sum(bytes_held.values())], seconds)


if __name__ == "__main__":
    main()
