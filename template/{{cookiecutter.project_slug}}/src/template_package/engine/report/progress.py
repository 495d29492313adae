"""Lightning's TQDM progress bar, redrawn by time rather than every n batches. Depends on lightning."""

import time

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import convert_inf

from ..internals import bars_made


class TimedProgressBar(TQDMProgressBar):
    """Lightning's TQDM progress bar, redrawn at most every `refresh_seconds` instead of every n batches and up to
    four times at each epoch boundary: a redraw gathers the metrics shown, a cost per redraw that
    benchmarks/feature_costs.py prints. A fixed batch count also redraws fast steps too often and
    slow ones too rarely. With `leave=True`, each epoch's bar is left with its final count, as Lightning's is."""

    def __init__(self, refresh_seconds: float = 1.0, leave: bool = False) -> None:
        super().__init__(refresh_rate=1, leave=leave)
        self.refresh_seconds, self.leave = refresh_seconds, leave
        self._drawn = 0.0

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """End the bars' line, so that the error's one line starts a line of its own."""
        for bar in bars_made(self):
            if not bar.disable:
                bar.leave = True
                bar.close()

    def _due(self) -> bool:
        now = time.monotonic()
        if now - self._drawn >= self.refresh_seconds:
            self._drawn = now
            return True
        return False

    def _should_update(self, current: int, total: int) -> bool:  # Lightning asks this at each evaluation batch
        """By time; and at the last batch where the bar is left (or validate, test and predict draw their last)."""
        last = current == total and (self.leave or self.trainer.state.fn != "fit")
        return self.is_enabled and (last or self._due())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        bar = self.train_progress_bar
        bar.n = batch_idx + 1  # counted at every batch, so that any redraw (after validation too) shows it
        if self._should_update(bar.n, bar.total):
            bar.set_postfix(self.get_metrics(trainer, pl_module))  # (this redraws)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        if not self.leave:  # a run resumed mid-epoch gets no on_train_epoch_start: the epoch it goes on with
            self.on_train_epoch_start(trainer)
            self.train_progress_bar.n = trainer.fit_loop.epoch_loop.batch_progress.current.completed

    def on_train_epoch_start(self, trainer: L.Trainer, *_) -> None:
        if self.leave:
            return super().on_train_epoch_start(trainer)
        bar = self.train_progress_bar
        bar.set_description(f"Epoch {trainer.current_epoch}", refresh=False)
        due = self._due()
        if not due:  # tqdm's reset always redraws: shadowed for this call, the next timed redraw shows the epoch
            bar.refresh = lambda *args, **kwargs: None
        try:
            bar.reset(convert_inf(self.total_train_batches))
        finally:
            if not due:
                del bar.refresh
        bar.initial = 0

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.leave or self._due():
            super().on_train_epoch_end(trainer, pl_module)
