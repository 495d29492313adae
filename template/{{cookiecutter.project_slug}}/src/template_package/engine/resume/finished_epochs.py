"""A run resumed from a state saved at an epoch's end goes on with the next epoch, whether or not max_steps is set.

Lightning's fit loop treats every resume with `trainer.max_steps` set as a restart inside an epoch (its
`_FitLoop.restarting`: `restarting and epoch_unfinished or self._iteration_based_training()`, Lightning PR #12821).
From a state saved after an epoch had ended, the resumed run then
re-enters the finished epoch: it trains other steps than the run that never stopped, with exit 0 (a stream's next
epoch ends after one batch; tests/test_resume.py). Without max_steps the
same checkpoint resumes exactly. `keep_finished_epochs_finished` gives the trainer a fit loop that restarts only an
epoch that had not ended, as Lightning does without max_steps. Depends on lightning only.
"""

import lightning as L

from ..internals import _FitLoop, set_restarting


class _FitLoopThatKeepsFinishedEpochs(_FitLoop):
    """Lightning's fit loop, restarting only an epoch that had not ended when its state was saved."""

    @_FitLoop.restarting.setter
    def restarting(self, restarting: bool) -> None:
        epoch = self.epoch_progress.current
        unfinished = epoch.ready != epoch.processed or epoch.started != epoch.processed
        set_restarting(self, restarting and unfinished)


def keep_finished_epochs_finished(trainer: L.Trainer) -> None:
    """Before a checkpoint's loops are loaded (a callback's `setup`): a finished epoch stays finished on resume."""
    if type(trainer.fit_loop) is _FitLoop:  # (a fit loop of the user's own class is left as it is)
        trainer.fit_loop.__class__ = _FitLoopThatKeepsFinishedEpochs
