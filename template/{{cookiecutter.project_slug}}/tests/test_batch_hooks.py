"""Lightning calls only the batch hooks a callback implements under the engine's Trainer; every other hook is called
as before."""

import lightning as L
import pytest
from lightning.pytorch.profilers import Profiler

from template_package.engine.internals import BATCH_HOOKS, leave_out_empty_batch_hooks
from template_package.engine.report.progress import TimedProgressBar
from template_package.engine.report.throughput import Throughput
from template_package.engine.training.trainer import Trainer

from helpers.stand_in import StandInClassifier, StandInData


class HookCalls(Profiler):
    """Counts the callback hooks Lightning calls: it profiles each as `[Callback]<state key>.<hook>`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def start(self, action_name: str) -> None:
        if action_name.startswith("[Callback]"):
            self.calls[action_name] = self.calls.get(action_name, 0) + 1

    def stop(self, action_name: str) -> None:
        pass

    def summary(self) -> str:
        return ""

    def of(self, hook: str) -> dict[str, int]:
        return {name.removeprefix("[Callback]"): n for name, n in self.calls.items() if name.endswith(f".{hook}")}


class ZeroGrads(L.Callback):
    """A callback of the user's, with one batch hook of its own."""

    def __init__(self) -> None:
        self.calls = 0

    def on_before_zero_grad(self, trainer, pl_module, optimizer) -> None:
        self.calls += 1


class ZeroGradsAsWell(ZeroGrads):
    def on_before_zero_grad(self, trainer, pl_module, optimizer) -> None:
        super().on_before_zero_grad(trainer, pl_module, optimizer)
        super(ZeroGrads, self).on_before_zero_grad(trainer, pl_module, optimizer)  # Callback's empty hook


def fit(tmp_path, trainer_class, steps: int = 5) -> tuple[L.Trainer, HookCalls, list[ZeroGrads]]:
    counted = HookCalls()
    users = [ZeroGrads(), ZeroGradsAsWell()]
    trainer = trainer_class(
        max_steps=steps, callbacks=[TimedProgressBar(), Throughput(), *users], profiler=counted,
        default_root_dir=tmp_path, enable_checkpointing=False, logger=False, enable_model_summary=False,
        limit_val_batches=0, num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(StandInClassifier(num_classes=10, in_channels=1, warmup=1), StandInData())
    return trainer, counted, users


def test_the_engines_trainer_calls_only_the_batch_hooks_callbacks_implement(tmp_path):
    trainer, counted, users = fit(tmp_path / "engine", Trainer)
    assert [user.calls for user in users] == [5, 5]  # the user's hooks, and a super() call to Callback's empty one
    assert set(counted.of("on_before_zero_grad")) == {
        "ZeroGrads.on_before_zero_grad",
        "ZeroGradsAsWell.on_before_zero_grad",
    }
    assert counted.of("on_after_backward") == {}  # no callback of the run implements it
    assert set(counted.of("on_train_batch_end")) == {
        "TimedProgressBar.on_train_batch_end", "Throughput.on_train_batch_end", "RunSettings.on_train_batch_end",
    }  # fmt: skip
    assert counted.of("on_train_epoch_start")["ZeroGrads.on_train_epoch_start"] == 1  # not a batch hook: as before
    # Lightning's own Trainer, for comparison, calls every callback's six training-batch hooks at every batch.
    _, lightnings, _ = fit(tmp_path / "lightning", L.Trainer)
    assert lightnings.of("on_after_backward") and set(lightnings.of("on_after_backward").values()) == {5}
    engine_calls = sum(n for name, n in counted.calls.items() if name.split(".")[-1] in BATCH_HOOKS)
    lightning_calls = sum(n for name, n in lightnings.calls.items() if name.split(".")[-1] in BATCH_HOOKS)
    assert lightning_calls == 4 * 6 * 5  # its 4 callbacks' six hooks, 5 batches
    assert engine_calls <= lightning_calls / 3  # with the engine's own 3 callbacks more


def test_lightning_skips_a_callback_hook_that_is_not_callable(tmp_path):
    """What leave_out_empty_batch_hooks relies on, pinned: a hook set to None on a callback is not called."""
    callbacks = [ZeroGrads(), L.Callback()]
    leave_out_empty_batch_hooks(callbacks)
    assert all(getattr(callbacks[1], hook) is None for hook in BATCH_HOOKS)
    assert callbacks[0].on_before_zero_grad is not None and callbacks[0].on_train_batch_end is None
    trainer = L.Trainer(max_steps=3, callbacks=callbacks, default_root_dir=tmp_path, barebones=True)
    trainer.fit(StandInClassifier(num_classes=10, in_channels=1, warmup=1), StandInData())
    assert trainer.global_step == 3 and callbacks[0].calls == 3


@pytest.mark.parametrize("hook", BATCH_HOOKS)
def test_every_batch_hook_is_a_hook_of_lightnings_callback(hook):
    assert callable(getattr(L.Callback, hook))
