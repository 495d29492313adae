"""What a training epoch has accumulated when a checkpoint is taken: the state of every torchmetrics `Metric` the
module holds, logged or not, and Lightning's sums of the tensors logged with `self.log(..., on_epoch=True)`, every
rank's own. Without them a run resumed mid-epoch logs that epoch's values over its resumed part only (Lightning saves
neither: a Metric's states are not in the module's `state_dict` unless made persistent, and the epoch's sums live in
the epoch loop's result collection, which no checkpoint holds).

Kept under the checkpoint's own key, so the module's `state_dict` keys stay as they are. The metrics are put back
after the module's own `on_train_start` (a module may reset a metric there: the run that never stopped did it at its
own start) and before the resumed run's first step; a Lightning sum is added back after the first batch that logs it
again, when it holds that batch's value alone, so that the additions come in the uninterrupted run's order, and what
the resumed part of the epoch never logs is logged again at its end, with the stopped run's arguments. A
checkpoint taken at an epoch's end holds the metrics as the next epoch starts with them (Lightning resets those it
logged), one taken during a validation of training the states the validation found. Depends on torch, torchmetrics,
lightning and the engine's internals.py.
"""

import lightning as L
import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torchmetrics import Metric

from ..internals import add_to_epoch_sums, epoch_sums, log_again, metrics_lightning_logs, set_update_count

KEY = "epoch_state"  # in a checkpoint: one row per rank, {"metrics": {name: states}, "sums": {key: values}}
RESET = "reset"  # a metric's row at an epoch's end when Lightning resets it there
UPDATES = "_update_count"  # in a metric's row, beside its states


def metric_states(module: torch.nn.Module) -> dict[str, dict]:
    """Every torchmetrics Metric of `module`, by its name in the module, and a CPU copy of its states with the count
    of its updates (torchmetrics warns at a compute after none)."""
    return {
        name: {
            **apply_to_collection(metric.metric_state, torch.Tensor, lambda t: t.detach().cpu().clone()),
            UPDATES: metric.update_count,
        }
        for name, metric in module.named_modules()
        if isinstance(metric, Metric)
    }


def put_back(module: torch.nn.Module, saved: dict[str, dict | str]) -> None:
    """Give each Metric of `module` its saved states (or reset it, where Lightning reset it)."""
    metrics = {name: metric for name, metric in module.named_modules() if isinstance(metric, Metric)}
    for name, states in saved.items():
        metric = metrics.get(name)
        if metric is None:
            continue
        metric.reset()  # (its cached values too)
        if states == RESET:
            continue
        device = metric.device
        for state, value in states.items():
            if state != UPDATES:
                setattr(metric, state, apply_to_collection(value, torch.Tensor, lambda t: t.to(device)))  # noqa: B023
        set_update_count(metric, states.get(UPDATES, 0))


def every_rank(row: dict, trainer: L.Trainer) -> list[dict]:
    """`row` of every rank, in rank order (one rank's alone on one process)."""
    if trainer.world_size == 1:
        return [row]
    rows = [None] * trainer.world_size
    torch.distributed.all_gather_object(rows, row)
    return rows


class EpochState:
    """Saves and puts back what a training epoch accumulated (see the module docstring); ExactResume calls these."""

    def __init__(self) -> None:
        self._before_validation: dict | None = None  # the metrics as a validation of training found them
        self._loaded: dict | None = None  # this rank's row of the resumed checkpoint, until the first step
        self._sums: dict = {}  # Lightning's sums still to add back, by key

    def validation_starts(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._before_validation = metric_states(pl_module)

    def validation_ended(self) -> None:
        self._before_validation = None

    def save(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        epochs = checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]
        metrics = dict(self._before_validation or metric_states(pl_module))
        sums = {}
        if epochs["started"] > epochs["processed"]:  # inside an epoch; with the sums not added back yet
            sums = {**apply_to_collection(epoch_sums(trainer), torch.Tensor, lambda t: t.detach().cpu().clone()),
                    **self._sums}  # fmt: skip
        else:  # at its end: as the next epoch starts with them
            logged = {id(metric) for metric in metrics_lightning_logs(trainer)}
            metrics.update({name: RESET for name, m in pl_module.named_modules() if id(m) in logged})
        checkpoint[KEY] = every_rank({"metrics": metrics, "sums": sums}, trainer)

    def load(self, trainer: L.Trainer, checkpoint: dict) -> None:
        rows = checkpoint.get(KEY)
        self._loaded = rows[trainer.global_rank] if rows and len(rows) == trainer.world_size else None

    def before_the_first_step(self, pl_module: L.LightningModule) -> None:
        """At the resumed run's first epoch start or batch start, after the module's on_train_start."""
        loaded, self._loaded = self._loaded, None
        if loaded is not None:
            put_back(pl_module, loaded["metrics"])
            self._sums = dict(loaded["sums"])

    def after_the_batch(self, trainer: L.Trainer) -> None:
        """After a training batch's hooks: add back the sums this batch logged for the first time since the resume."""
        if self._sums:
            for key in add_to_epoch_sums(trainer, self._sums):
                del self._sums[key]

    def epoch_ends(self, trainer: L.Trainer) -> None:
        """Before Lightning logs the epoch's values: what the resumed part of the epoch never logged is logged as the
        stopped run had (a run stopped in the validation after an epoch's last batch trains no batch of it again)."""
        if self._sums:
            log_again(trainer, trainer.lightning_module, self._sums)
        self._sums = {}
