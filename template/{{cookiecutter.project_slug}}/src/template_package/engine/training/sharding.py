"""Models larger than one device: FSDP2 (`torch.distributed.fsdp.fully_shard`) through Lightning's
ModelParallelStrategy, sharding parameters, gradients and optimizer state over every process.

`ShardedStrategy` (configs/fsdp.yaml) is ModelParallelStrategy with:
- one data-parallel dimension over all processes (Lightning's "auto" puts tensor parallelism inside a node and one
  data-parallel replica per node: on one machine that shards nothing);
- a sharding rule for a module without `configure_model` of its own (which ModelParallelStrategy refuses): see
  `shard_by_rule`; a module's own `configure_model` wins;
- under bf16-mixed, FSDP2's mixed precision: parameters gathered in bfloat16 for compute, gradients reduced in float32;
- buffers (BatchNorm's running statistics) copied from rank 0 before each training and validation step, as DDP does,
  and before a checkpoint is taken: FSDP2 leaves them to each process, and a checkpoint holds one copy, so a resumed
  run would otherwise differ;
- checkpoints that are complete or absent (resume/sharded_folders.py), whose waits among the processes are bounded
  by `save_timeout`.

Depends on torch, lightning and the engine's errors.py, resume/sharded_folders.py and resume/durable.py.
"""

import contextlib
import signal
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import BaseFinetuning, WeightAveraging
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from ..errors import UsageError
from ..internals import ranks_shown_running, set_data_parallel_size, stop_watching_ranks
from ..resume import sharded_folders
from ..resume.durable import keeping_write_errors

CONTAINERS = (nn.ModuleList, nn.Sequential)


class FileSystemKeepingWriteErrors(FileSystem):
    """DCP's local files, whose failed writes raise their OSError (a full disk named as such, as for a whole
    checkpoint), not torch.save's `unexpected pos`."""

    @contextlib.contextmanager
    def create_stream(self, path, mode: str):
        with super().create_stream(path, mode) as stream, keeping_write_errors(stream) as writer:
            yield writer


def shard_units(module: nn.Module) -> list[nn.Module]:
    """The modules that `shard_by_rule` makes FSDP units below a root: every element with parameters of an
    nn.ModuleList or nn.Sequential (a transformer's blocks, a ResNet stage's blocks, the layers of a Sequential),
    outermost first, not looking inside an element once it is a unit."""
    units = []
    for child in module.children():
        if isinstance(module, CONTAINERS):
            if any(True for _ in child.parameters()):
                units.append(child)
        else:
            units.extend(shard_units(child))
    return units


def shard_by_rule(module: L.LightningModule, mesh, mp_policy: MixedPrecisionPolicy) -> None:
    """The engine's sharding of a LightningModule without `configure_model` of its own: each direct child module that
    has parameters is an FSDP root, with the elements of its ModuleLists and Sequentials (`shard_units`) as units of
    their own. An FSDP unit gathers its parameters just before its forward and frees them after (and again for the
    backward), so at most a unit's parameters are whole at a time, besides the roots' own.

    The LightningModule itself is not sharded: its training_step may call any child, and FSDP gathers a unit's
    parameters only in that unit's forward. Parameters held by the LightningModule itself are refused: nothing would
    reduce their gradients. Sharding twice (validate after fit on the same module) does nothing."""
    if any(isinstance(m, FSDPModule) for m in module.modules()):
        return
    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise UsageError(
            f"{type(module).__name__} holds parameters of its own ({', '.join(own[:3])}), outside any submodule, "
            "which the sharded strategy cannot shard: move them into a submodule, or shard the model yourself in "
            "configure_model (README: Models larger than one GPU)"
        )
    for child in module.children():
        if not any(True for _ in child.parameters()):
            continue  # metrics, losses: nothing to shard
        for unit in shard_units(child):
            fully_shard(unit, mesh=mesh, mp_policy=mp_policy)
        fully_shard(child, mesh=mesh, mp_policy=mp_policy)


class ShardedStrategy(ModelParallelStrategy):
    """FSDP2 over every process (see the module docstring), on GPUs with NCCL or on CPUs with gloo.

    Args:
        save_timeout: seconds a process that has written its part of a checkpoint waits for the others (and for the
            folder's swap into place) before the run stops with one line; the previous checkpoint stays. Raise it
            for a filesystem whose writes can stall longer.
    """

    def __init__(self, save_timeout: float = 60.0) -> None:
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1)
        if save_timeout <= 0:
            raise UsageError(f"save_timeout={save_timeout} must be > 0 seconds")
        self.save_timeout = save_timeout
        self._checkpoint_group: dist.ProcessGroup | None = None
        self._set_configure_model = False

    def setup_environment(self) -> None:
        set_data_parallel_size(self, self.num_nodes * self.num_processes)  # data-parallel over every process
        trainer = self.lightning_module.trainer
        if any(isinstance(callback, WeightAveraging) for callback in trainer.callbacks):
            raise UsageError(
                "EMA and other weight averages (configs/ema.yaml, Lightning's WeightAveraging) keep a whole, unsharded "
                "copy of the model on every process, which does not fit where sharding is needed and cannot follow "
                "sharded weights: leave configs/ema.yaml out with configs/fsdp.yaml"
            )
        super().setup_environment()
        # The checkpoints' own process group, gloo on any device: every wait of a save is bounded by its timeout
        # (the training group's default is far longer), and a dead peer closes its connections at once.
        self._checkpoint_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.save_timeout))

    def setup(self, trainer: L.Trainer) -> None:
        finetuning = [type(c).__name__ for c in trainer.callbacks if isinstance(c, BaseFinetuning)]
        if finetuning:  # (it maps the optimizer's parameters to names by identity; sharding replaces them)
            raise UsageError(
                f"{finetuning[0]} does not work under sharded training (configs/fsdp.yaml): Lightning's BaseFinetuning "
                "finds the optimizer's parameters by identity, which sharding replaces; fine-tune with DDP "
                "(--trainer.strategy ddp)"
            )
        module = self.lightning_module
        if not is_overridden("configure_model", module):
            # The engine's rule stands in for the module's configure_model (Lightning refuses a module without one).
            module.configure_model = partial(shard_by_rule, module, self.device_mesh["data_parallel"], self.mp_policy)
            self._set_configure_model = True
            module.configure_model()
        super().setup(trainer)
        if trainer.state.fn == "fit" and self.is_global_zero:
            for folder in {Path(c.dirpath) for c in trainer.callbacks if getattr(c, "dirpath", None)}:
                sharded_folders.remove_leftovers(folder)  # what saves killed half-way left

    @property
    def mp_policy(self) -> MixedPrecisionPolicy:
        """bf16-mixed: parameters gathered in bfloat16 for compute, gradients reduced and kept in float32; otherwise
        FSDP2 computes in the parameters' own dtype (float32 under 32-true, bfloat16 under bf16-true)."""
        plugin = self.precision_plugin
        if isinstance(plugin, MixedPrecision) and plugin.precision == "bf16-mixed":
            return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        return MixedPrecisionPolicy()

    def training_step(self, *args, **kwargs):
        self._copy_buffers_from_rank_zero()
        return super().training_step(*args, **kwargs)

    def validation_step(self, *args, **kwargs):
        self._copy_buffers_from_rank_zero()  # every process validates the weights a checkpoint holds
        return super().validation_step(*args, **kwargs)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        self._copy_buffers_from_rank_zero()  # DCP saves one process's copy of a buffer: it must be rank 0's
        return super().lightning_module_state_dict()

    def _copy_buffers_from_rank_zero(self) -> None:
        """Every process's buffers become rank 0's, one broadcast per dtype (DDP's broadcast_buffers)."""
        if self.world_size == 1:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for buffer in self.lightning_module.buffers():
            by_dtype.setdefault(buffer.dtype, []).append(buffer)
        for buffers in by_dtype.values():
            flat = torch.cat([buffer.reshape(-1) for buffer in buffers])
            dist.broadcast(flat, src=0)
            for buffer, value in zip(buffers, flat.split([b.numel() for b in buffers]), strict=True):
                buffer.copy_(value.view_as(buffer))

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        """Every process writes its shards into a new folder, swapped in for `filepath` once all are written
        (sharded_folders.save); Lightning's layout inside (DCP files and meta.pt), so Lightning loads it."""
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(self.broadcast(str(filepath)))  # every rank writes where rank 0 does
        shards = {"state_dict": checkpoint.pop("state_dict")}
        shards.update({f"optimizer_{i}": state for i, state in enumerate(checkpoint.pop("optimizer_states", []))})
        with ranks_shown_running(self.launcher):  # a rank that stops in the save is this process's to report
            try:
                sharded_folders.save(shards, checkpoint, path, self._checkpoint_group, self.storage_writer)
            except Exception:  # another rank stopped or stalled: stop the others before the watcher sees them
                self._stop_the_ranks_started_here()
                raise

    def storage_writer(self, folder: Path) -> FileSystemWriter:
        """How this process writes its shards into `folder`: one file a process, each fsynced."""
        writer = FileSystemWriter(folder, single_file_per_rank=True, sync_files=True, overwrite=False)
        writer.fs = FileSystemKeepingWriteErrors()
        return writer

    def remove_checkpoint(self, filepath) -> None:
        if self.is_global_zero:
            sharded_folders.remove(Path(filepath))

    def on_exception(self, exception: BaseException) -> None:
        """A run that fails takes the processes it started down with it (Lightning does so only for Ctrl-C): one
        stuck in a save (a hung filesystem) would otherwise outlive it, stopped, holding the run's output open. Then
        it exits with its own line and status, not SIGKILLed by the launcher's watcher for the ranks it killed."""
        # (ModelParallelStrategy's one launcher starts this script again for the other processes; there is none when
        # torchrun or a cluster started them)
        if isinstance(exception, Exception):
            self._stop_the_ranks_started_here()

    def _stop_the_ranks_started_here(self) -> None:
        if self.launcher is not None:
            self.launcher.kill(signal.SIGKILL)
            stop_watching_ranks(self.launcher)

    def teardown(self) -> None:
        if self._set_configure_model:  # the module is the user's: it leaves as it came
            vars(self.lightning_module).pop("configure_model", None)
            self._set_configure_model = False
        super().teardown()
