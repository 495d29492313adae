"""Manual optimization (GANs, several optimizers, any `automatic_optimization = False` module) with the run's settings.

Lightning refuses `Trainer(gradient_clip_val=...)` for a module that optimizes manually ("Automatic gradient clipping
is not supported for manual optimization"), so the engine's default clipping would stop such a module before it
trains. The engine's Trainer keeps the configured value aside while Lightning checks its settings and puts it back
for training, where the module clips with it itself, between `manual_backward` and `optimizer.step()`:

    self.clip_gradients(optimizer, self.trainer.gradient_clip_val, self.trainer.gradient_clip_algorithm)

A module that never makes that call during its first training batch gets one notice saying so: the configured
clipping is then not applied. Depends on lightning only.
"""

import sys

import lightning as L


def keep_clipping_aside(trainer: L.Trainer, model: L.LightningModule) -> None:
    """Before Lightning checks a manually optimizing `model`'s settings: the configured clipping out of its sight."""
    trainer.manual_clipping = None
    if not model.automatic_optimization and (trainer.gradient_clip_val or 0) > 0:
        trainer.manual_clipping, trainer.gradient_clip_val = trainer.gradient_clip_val, None


class ManualClipping:
    """Puts the configured clipping back once Lightning has checked the settings, for `training_step` to apply, and
    says once if the first training batch did not apply it (run_settings.RunSettings calls these from its hooks)."""

    def __init__(self) -> None:
        self._clips = 0
        self._watching = None  # the precision plugin whose clip_gradients is counted, during the first batch

    def put_back(self, trainer: L.Trainer, stage: str) -> None:
        value = getattr(trainer, "manual_clipping", None)
        if stage != "fit" or value is None:
            return
        trainer.gradient_clip_val = value
        plugin, clip = trainer.precision_plugin, trainer.precision_plugin.clip_gradients

        def counted(*args, **kwargs):
            self._clips += 1
            return clip(*args, **kwargs)

        plugin.clip_gradients, self._watching = counted, plugin  # (LightningModule.clip_gradients calls it)

    def batch_ended(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._watching is None:
            return
        self.stop_watching()
        if self._clips == 0 and trainer.is_global_zero:
            print(
                f"notice: {type(pl_module).__name__} optimizes manually and its first training batch clipped no "
                f"gradients, so trainer.gradient_clip_val={trainer.gradient_clip_val} is not applied: clip in "
                "training_step, between manual_backward and optimizer.step(), with self.clip_gradients(optimizer, "
                "self.trainer.gradient_clip_val, self.trainer.gradient_clip_algorithm) (docs/manual-optimization.md)",
                file=sys.stderr,
            )

    def stop_watching(self) -> None:
        if self._watching is not None:
            del self._watching.clip_gradients  # the class's own method again: nothing counted on later batches
            self._watching = None
