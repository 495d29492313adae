"""What decides the next step beyond the weights, optimizers, schedules and the loader's position: kept in every
checkpoint and put back or checked when a run resumes, for any module and any callback.

Every rank's random generators (rng.py) are saved and restored.

A callback may set training up in a hook that a resumed run does not repeat: Lightning's BaseFinetuning freezes the
backbone again in `setup` on every run and unfreezes it only at the start of its epoch, so a run resumed past that
start would train on with a frozen backbone. So each checkpoint records which parameters train (`requires_grad`),
each param group's settings and members by parameter name, BatchNorm's `track_running_stats` (which BaseFinetuning
switches with `train_bn=False`), each submodule's train/eval mode at the last training step (a save during validation
sees eval mode), and every callback's state (compared in a run resumed mid-epoch only: one resumed at an epoch's
start runs the epoch-start hooks the uninterrupted run ran, where a callback may restore itself, as
StochasticWeightAveraging does; a run resumed mid-epoch skips them). When a run resumes, after every restore hook
(the module's, Lightning's, each callback's) and before its first step, `TrainedState` puts back what it can
(trainable flags, BatchNorm's flag, modes) and stops on any other difference in one line naming it and both values.
Not compared, as they do not decide training: a checkpoint writer's state (paths and scores) and Timer's elapsed
time. `--allow_change callbacks.<Name>` lets a callback's state differ. A run resumed on another number of processes
(`--allow_change world_size`) says in a notice when it cannot be exact: its first step drew from torch's generators
(dropout), or BatchNorm layers compute per-device statistics. Depends on torch, lightning and rng.py.
"""

import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint
from torch import nn

from ..errors import UsageError
from .rng import RandomStates

KEY = "trained_state"  # in a checkpoint: what `observed` saw when it was taken
NOT_COMPARED = {"Timer": {"time_elapsed"}}  # a callback's keys that do not decide training (and every Checkpoint's)


def observed(module: nn.Module, optimizers: list, modes: dict[str, bool], world_size: int = 1) -> dict:
    """What decides the next step, as a checkpoint records it (`modes`: each submodule's, at the last step)."""
    return {
        "world_size": world_size,
        "requires_grad": {name: param.requires_grad for name, param in module.named_parameters()},
        "track_running_stats": {
            name: sub.track_running_stats
            for name, sub in module.named_modules()
            if isinstance(getattr(sub, "track_running_stats", None), bool)
        },
        "modes": modes,
        "param_groups": param_groups_of(module, optimizers),
    }


def param_groups_of(module: nn.Module, optimizers: list) -> list[list[dict]]:
    """Each optimizer's param groups, their parameters by name."""
    names = {id(param): name for name, param in module.named_parameters()}
    return [
        [{**group, "params": [names.get(id(p), "?") for p in group["params"]]} for group in optimizer.param_groups]
        for optimizer in optimizers
    ]


PER_DEVICE_NORMS = {f"{lazy}BatchNorm{n}d" for lazy in ("", "Lazy") for n in (1, 2, 3)}  # (not SyncBatchNorm)


def generator_states() -> list:
    return [torch.get_rng_state(), *(torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [])]


def modes_of(module: nn.Module) -> dict[str, bool]:
    return {name: sub.training for name, sub in module.named_modules()}


class TrainedState:
    """Records the generators (rng.RandomStates) and `observed` in each checkpoint and, on a resume, puts them back or
    stops (see the module docstring); ExactResume calls these from its hooks. `allowed`: the `--allow_change` options
    of the resumed run."""

    def __init__(self) -> None:
        self.random = RandomStates()
        self.allowed: list[str] = []
        self._modes: dict[str, bool] | None = None
        self._saved: dict | None = None
        self._moved_from: int | None = None  # the checkpoint's number of processes, when this run has another
        self._generators: list | None = None  # torch's generator states before the first step after a move

    def epoch_starts(self) -> None:
        self._modes = None  # (taken again at the epoch's first step: after every epoch-start hook)

    def save(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self.random.save(trainer, pl_module, checkpoint)
        modes = self._modes if self._modes is not None else modes_of(pl_module)
        checkpoint[KEY] = observed(pl_module, trainer.optimizers, modes, trainer.world_size)

    def load(self, trainer: L.Trainer, checkpoint: dict) -> None:
        self.random.load(checkpoint)
        epochs = checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]
        mid_epoch = epochs["started"] > epochs["processed"]  # (else it goes on at the next epoch's start)
        self._saved = {"state": checkpoint.get(KEY), "callbacks": checkpoint.get("callbacks", {}) if mid_epoch else {}}
        saved_world_size = (checkpoint.get(KEY) or {}).get("world_size", trainer.world_size)
        self._moved_from = saved_world_size if saved_world_size != trainer.world_size else None

    def train_starts(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.random.restore(trainer, pl_module)  # (after Lightning has seeded and built the loaders)
        saved, self._saved = self._saved, None
        if saved is None:
            return
        if saved["state"] is not None:
            put_back(pl_module, saved["state"])
            # (A model's settings allowed to change: its groups take the new ones, changes.ChangedModelSettings.)
            settings = not any(option.startswith("model.") for option in self.allowed)
            check_groups(trainer.optimizers, saved["state"]["param_groups"], pl_module, settings)
        check_callbacks(trainer.callbacks, saved["callbacks"], self.allowed)
        if self._moved_from is not None:
            unsynced = [name for name, sub in pl_module.named_modules() if type(sub).__name__ in PER_DEVICE_NORMS]
            if unsynced:
                self._notice(trainer, f"the model's BatchNorm layers ({', '.join(unsynced[:3])}) compute their "
                             "statistics per device and per batch, which another layout changes")  # fmt: skip

    def batch_starts(self, pl_module: L.LightningModule) -> None:
        if self._modes is None:  # at an epoch's first step (after its start hooks), and a resumed run's first
            self._modes = modes_of(pl_module)
        if self._moved_from is not None and self._generators is None:
            self._generators = generator_states()

    def before_backward(self, trainer: L.Trainer) -> None:
        if self._moved_from is None or self._generators is None:
            return
        drew = any(not torch.equal(a, b) for a, b in zip(self._generators, generator_states(), strict=True))
        if drew:
            self._notice(trainer, "its first step drew random numbers from torch's generators (dropout, say), and "
                         "each process draws its own")  # fmt: skip
        self._moved_from = None  # (the first resumed step only)

    def _notice(self, trainer: L.Trainer, why: str) -> None:
        if trainer.is_global_zero:
            moved = f"{self._moved_from} to {trainer.world_size} processes"
            print(f"notice: this run moved from {moved} and goes on inexactly: {why}, so from here it differs from "
                  "the run that never moved", file=sys.stderr)  # fmt: skip


def put_back(module: nn.Module, saved: dict) -> None:
    """The trainable flags, BatchNorm's flag and the train/eval modes as the checkpoint has them."""
    params, subs = dict(module.named_parameters()), dict(module.named_modules())
    for name, trainable in saved["requires_grad"].items():
        if name in params and params[name].requires_grad != trainable:
            params[name].requires_grad_(trainable)
    for name, tracks in saved["track_running_stats"].items():
        if name in subs:
            subs[name].track_running_stats = tracks
    for name, training in saved["modes"].items():
        if name in subs:
            subs[name].training = training


def check_groups(optimizers: list, saved: list[list[dict]], module: nn.Module, settings: bool = True) -> None:
    """Each optimizer's param groups are the checkpoint's: their parameters and, with `settings`, every setting."""
    live = param_groups_of(module, optimizers)
    if len(live) != len(saved):
        stop(f"the run has {len(live)} optimizers and the checkpoint {len(saved)}")
    for index, (groups, saved_groups) in enumerate(zip(live, saved, strict=True)):
        if len(groups) != len(saved_groups):
            stop(f"optimizer {index} has {len(groups)} param groups and the checkpoint's {len(saved_groups)}")
        for number, (group, saved_group) in enumerate(zip(groups, saved_groups, strict=True)):
            where = f"optimizer {index}'s param group {number}" + (f" ({group['name']})" if "name" in group else "")
            for key in sorted(group.keys() | saved_group.keys()) if settings else ["params"]:
                if not same(group.get(key), saved_group.get(key)):
                    live_value, saved_value = group.get(key), saved_group.get(key)
                    if key == "params":  # (the first parameter that differs, not the whole lists)
                        live_value, saved_value = next(
                            (a, b) for a, b in zip([*live_value, None], [*saved_value, None], strict=False) if a != b
                        )
                        raise UsageError(
                            f"the resumed run does not train the parameters the checkpoint did: {where} holds "
                            f"{live_value!r} where the checkpoint's held {saved_value!r} (a reparametrization no "
                            "checkpoint keeps, as ModelPruning's masks, or a hook that changed the groups on a "
                            "restart); start a new run"
                        )
                    stop(f"{where} has {key} {live_value!r} and the checkpoint {saved_value!r}")


def check_callbacks(callbacks: list[Callback], saved: dict, allowed: list[str]) -> None:
    for callback in callbacks:
        name = type(callback).__name__
        if callback.state_key not in saved or f"callbacks.{name}" in allowed or isinstance(callback, Checkpoint):
            continue
        live, kept = callback.state_dict(), saved[callback.state_key]
        for key in sorted(live.keys() | kept.keys(), key=str):
            if key not in NOT_COMPARED.get(name, ()) and not same(live.get(key), kept.get(key)):
                raise UsageError(
                    f"callback {name}'s state {key} is {shown(live.get(key))} in the resumed run and "
                    f"{shown(kept.get(key))} in the checkpoint, before the first step: it did not restore it, or a "
                    f"hook that runs on a restart changed it (a callback that restores in on_train_epoch_start, which "
                    f"a run resumed mid-epoch skips, resumes from a checkpoint of an epoch's end: last_checkpoint."
                    f"every_n_steps=0); fix the callback, or add --allow_change callbacks.{name} to go on anyway"
                )


def shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def same(a, b) -> bool:
    """Equal, tensors bit for bit, containers recursively."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def stop(difference: str) -> None:
    raise UsageError(
        f"the resumed run is not set up as the checkpoint was: {difference}, before the first step (a hook that runs "
        "on a restart changed it: setup, configure_optimizers, on_fit_start or a callback's load_state_dict); fix "
        "that hook, or start a new run"
    )
