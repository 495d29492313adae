"""The part of a sweep that runs in each trial's `fit` process: `ReportToTrial`, the callback that reports the trial's
metric to its study after each validation, prunes it, and records what it got (search.py starts the fit with it).
Depends on Optuna and Lightning.
"""

import lightning as L
import optuna
from lightning.pytorch.callbacks import Callback

from ..errors import UsageError
from ..internals import study_storage, trial_id_of


def pruner(pruning: bool) -> optuna.pruners.BasePruner:
    # From the third finished trial on, from the second validation on (the first says little).
    return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1) if pruning else optuna.pruners.NopPruner()


class ReportToTrial(Callback):
    """Reports a trial's metric after each validation, prunes it, and records what it got; in the trial's `fit`.

    Rank 0 reports to the study (its storage) and asks the pruner; every rank stops together after the epoch, as a
    pruned trial's training ends normally: `last.ckpt` is written, the process exits 0. A trial resumed after the
    decision stops at once. The trial's value, its best metric over the validations, goes to its user attributes,
    where the sweep reads it. The fit of fold f (of a cross-validated trial) reports its epoch e at step
    f * epochs_per_fold + e, and records its value as the user attribute `fold-<f>`.
    """

    def __init__(
        self, storage: str, trial_number: int, metric: str = "val/acc", pruning: bool = True,
        fold: int | None = None, epochs_per_fold: int = 0,
    ) -> None:  # fmt: skip
        self.storage, self.trial_number, self.metric, self.pruning = storage, trial_number, metric, pruning
        self.fold, self.epochs_per_fold, self.first_step = fold, epochs_per_fold, (fold or 0) * epochs_per_fold
        self._trial: optuna.Trial | None = None
        self._pruned = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and trainer.is_global_zero:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            study = optuna.load_study(study_name="sweep", storage=self.storage, pruner=pruner(self.pruning))
            storage = study_storage(study)
            study_id = storage.get_study_id_from_name(study.study_name)
            self._trial = optuna.Trial(
                study, storage.get_trial_id_from_study_id_trial_number(study_id, self.trial_number)
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_pruned(trainer, resumed=True)  # a trial resumed after its pruning decision

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logged = [name for name in trainer.callback_metrics if name not in ("epoch", "step")]
        if self.metric not in trainer.callback_metrics and logged:
            raise UsageError(
                f"sweep.metric={self.metric!r} is not logged by {type(pl_module).__name__}, which logs "
                f"{', '.join(sorted(logged))} in validation: set --sweep.metric (or checkpoint.monitor) to one of them"
            )
        if trainer.sanity_checking or self.metric not in trainer.callback_metrics:
            return
        if self._trial is not None:
            value = float(trainer.callback_metrics[self.metric])
            self._trial.report(value, step=self.first_step + trainer.current_epoch)
        self._stop_if_pruned(trainer)

    def _values(self) -> dict[int, float]:
        """What this run (this fold) reported: {step: value}."""
        values = self._trial.storage.get_trial(trial_id_of(self._trial)).intermediate_values
        if self.fold is None:
            return values
        return {step: v for step, v in values.items() if 0 <= step - self.first_step < self.epochs_per_fold}

    def _stop_if_pruned(self, trainer: L.Trainer, resumed: bool = False) -> None:
        # At the start, only a run that reported before (a new fold is not judged by the last one's decision).
        prune = self._trial is not None and (not resumed or bool(self._values())) and bool(self._trial.should_prune())
        self._pruned = trainer.strategy.broadcast(prune, src=0)  # rank 0 decides, every rank stops
        if self._pruned:
            trainer.should_stop = True

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._trial is None:
            return
        values = self._values().values()
        if not values:
            return
        best = max(values) if self._trial.study.direction == optuna.study.StudyDirection.MAXIMIZE else min(values)
        if self.fold is None:
            self._trial.set_user_attr("value", best)
            self._trial.set_user_attr("pruned", self._pruned)
        else:
            self._trial.set_user_attr(f"fold-{self.fold}", {"value": best, "pruned": self._pruned})
