"""Every rank's random generators in each checkpoint: without them a resumed run draws different dropout masks and
epoch shuffles than the run that never stopped (Lightning saves none of them). Kept by resume/trained_state.py's
TrainedState.

Depends on torch, numpy, lightning and the engine's data/sampling.py (seeds) and training/batch_layout.py (a run
moved to another number of processes).
"""

import random

import lightning as L
import numpy as np
import torch

from ..data.sampling import seed_generators, seed_of
from ..errors import UsageError
from ..training.batch_layout import KEY as LAYOUT

KEY = "rng_states"  # in a checkpoint: one row per rank of each generator's state


def rng_state_tensors(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's python, numpy, torch and CUDA RNG states as int64 tensors (so `weights_only` loading works)."""
    version, mt_state, gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    states = {
        "python": torch.tensor([version, *mt_state, gauss is not None], dtype=torch.int64),
        "python_gauss": torch.tensor([gauss or 0.0], dtype=torch.float64),
        "numpy": torch.tensor([*np_keys.tolist(), np_pos, np_has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor([np_gauss], dtype=torch.float64),
        "torch": torch.get_rng_state().to(torch.int64),
    }
    if device.type == "cuda":
        states["cuda"] = torch.cuda.get_rng_state(device).to(torch.int64)
    return states


def set_rng_state_tensors(states: dict[str, torch.Tensor], device: torch.device) -> None:
    python = states["python"].tolist()
    gauss = states["python_gauss"].item() if python[-1] else None
    random.setstate((python[0], tuple(python[1:-1]), gauss))
    numpy = states["numpy"].tolist()
    np.random.set_state(
        ("MT19937", np.array(numpy[:-2], dtype=np.uint32), numpy[-2], numpy[-1], states["numpy_gauss"].item())
    )
    torch.set_rng_state(states["torch"].to(torch.uint8))
    if "cuda" in states and device.type == "cuda":
        torch.cuda.set_rng_state(states["cuda"].to(torch.uint8), device)


def gather_rows(tensor: torch.Tensor, world_size: int) -> torch.Tensor:
    """Every rank's `tensor`, stacked in rank order, on the CPU. (torch.distributed directly: Lightning's
    strategy.all_gather goes through a deprecated autograd-aware all_gather that warns at every checkpoint.)"""
    rows = [torch.empty_like(tensor) for _ in range(world_size)]
    torch.distributed.all_gather(rows, tensor)
    return torch.stack(rows).cpu()


class RandomStates:
    """Every rank's RNG states in each checkpoint, restored when training resumes: TrainedState calls these from its
    hooks.

    They are restored at the start of training, after Lightning has seeded everything and rebuilt the data loaders,
    so nothing draws from the restored generators before the first resumed batch. A run resumed on another number of
    processes (training/batch_layout.py) seeds each rank's generators from (seed, step, rank) instead.

    Validation during training leaves the random states as it found them: a validation_step that samples would
    otherwise shift the training's draws, and differently in a resumed run, which skips the sanity check. A checkpoint
    taken during validation holds the states validation found. (The eval loaders' worker seeds come from generators
    of their own: loaders.ResumableLoaders.)
    """

    def __init__(self) -> None:
        self._to_restore: dict[str, torch.Tensor] | None = None
        self._may_move = False  # whether the checkpoint may go on on another number of processes
        self._before_validation: dict[str, torch.Tensor] | None = None

    def validation_starts(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._before_validation = rng_state_tensors(pl_module.device)

    def validation_ended(self, pl_module: L.LightningModule) -> None:
        if self._before_validation is not None:
            set_rng_state_tensors(self._before_validation, pl_module.device)
            self._before_validation = None

    def save(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # During a validation of training (a stop signal there, validation.py): the states validation found.
        states = self._before_validation or rng_state_tensors(pl_module.device)
        if trainer.world_size > 1:  # one row per rank; rank 0 writes them all
            states = {k: gather_rows(v.to(pl_module.device), trainer.world_size) for k, v in states.items()}
        else:
            states = {k: v.unsqueeze(0) for k, v in states.items()}
        checkpoint[KEY] = states

    def load(self, checkpoint: dict) -> None:
        self._to_restore = checkpoint.get(KEY)
        # A run may move to another number of processes only with a checkpoint that records its batch layout
        # (loaders.ResumableLoaders refuses the move unless it was asked for).
        self._may_move = LAYOUT in checkpoint

    def restore(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._to_restore is None:
            return
        saved, rank = len(self._to_restore["torch"]), trainer.global_rank
        if saved == trainer.world_size:
            set_rng_state_tensors({k: v[rank] for k, v in self._to_restore.items()}, pl_module.device)
        elif self._may_move:  # on another number of processes: new streams, the same on every restart
            seed = seed_of(torch.initial_seed(), trainer.global_step, rank)
            seed_generators(seed)
            if pl_module.device.type == "cuda":
                torch.cuda.manual_seed(seed)
        else:
            raise UsageError(f"the checkpoint was saved by {saved} processes and this run has {trainer.world_size}")
        self._to_restore = None
