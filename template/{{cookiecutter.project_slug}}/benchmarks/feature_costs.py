"""What each of the template's features costs per optimizer step: `python benchmarks/feature_costs.py`.

benchmarks/overhead.py gives the template's total cost over Lightning's floor; a difference of two such runs is too
noisy for a feature's tens of microseconds. Here the default run itself (digits, 19-step epochs, validation after
each) is timed from inside: every hook of every callback, the model's writes to the loggers and its NaN check,
and Lightning's own calling of the callbacks' hooks (its `_call_callback_hooks`, less the hooks' own time), each
summed over the run. Per step: the batch hooks (and the model's parts); per epoch: the epoch and validation hooks,
shared out over the epoch's steps; once: setup, start and end of the run, checkpoint saves (in ms a run). A timer's
own cost, measured on an empty call, is taken off each timed call. Figures are medians over `--rounds` runs.
"""

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter

import lightning as L
import torch
from lightning.pytorch.trainer import call

from template_package.engine.cli.main import build_cli
from template_package.engine.training.recipe import TrainingRecipe

HOOKS = [name for name in vars(L.Callback) if name.startswith("on_") or name in ("setup", "teardown")]
PER_STEP = {"on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
            "on_before_optimizer_step", "on_before_zero_grad"}  # fmt: skip
PER_EPOCH = {hook for hook in HOOKS if "epoch" in hook or "validation" in hook} - PER_STEP
spent: Counter = Counter()  # seconds, by (feature, "step" | "epoch" | "once")
calls: Counter = Counter()


def kind(hook: str) -> str:
    return "step" if hook in PER_STEP else "epoch" if hook in PER_EPOCH else "once"


def timer_cost() -> float:
    """Seconds a timed call adds around the call itself."""

    def empty() -> None:
        return None

    wrapped = timed(("calibration", "once"), empty, 0.0)
    start = time.perf_counter()
    for _ in range(100_000):
        wrapped()
    with_timer = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(100_000):
        empty()
    return (with_timer - (time.perf_counter() - start)) / 100_000


def timed(key: tuple[str, str], fn, overhead: float):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - start - overhead
            calls[key] += 1

    return wrapper


class HookTimer(L.Callback):
    """At `setup`, wraps every hook of the other callbacks in a timer; times the training's steps."""

    overhead = 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for callback in trainer.callbacks:
            if callback is not self:
                for hook in HOOKS:
                    if getattr(callback, hook) is not None:  # (None: a batch hook Lightning skips, see internals.py)
                        key = (type(callback).__name__, kind(hook))
                        setattr(callback, hook, timed(key, getattr(callback, hook), self.overhead))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.started, self.steps_before = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.per_step = (time.perf_counter() - self.started) / (trainer.global_step - self.steps_before)


def one_run(root: str, epochs: int, overhead: float) -> tuple[dict[tuple[str, str], float], float, int]:
    """Seconds of each (feature, kind): per optimizer step for "step" and "epoch", per run for "once"; the seconds
    of a whole step; the number of callbacks."""
    spent.clear()
    calls.clear()
    HookTimer.overhead = overhead
    sys.modules[__name__].HookTimer = HookTimer  # for the CLI to find it by name
    dispatch = call._call_callback_hooks
    call._call_callback_hooks = timed(("dispatch", "all"), dispatch, overhead)
    log_step, nan_check = TrainingRecipe.on_train_batch_end, torch.isfinite
    TrainingRecipe.on_train_batch_end = timed(("the recipe's writes to the loggers", "step"), log_step, overhead)
    torch.isfinite = timed(("the recipe's NaN check of each loss", "step"), nan_check, overhead)
    try:
        args = ["fit", f"--trainer.max_epochs={epochs}", f"--trainer.default_root_dir={root}"]
        trainer = build_cli([*args, f"--trainer.callbacks+={__name__}.HookTimer"]).trainer
    finally:
        call._call_callback_hooks, TrainingRecipe.on_train_batch_end, torch.isfinite = dispatch, log_step, nan_check
    timer = next(c for c in trainer.callbacks if isinstance(c, HookTimer))
    steps = trainer.global_step
    callbacks = {type(c).__name__ for c in trainer.callbacks if c is not timer}
    costs = {key: seconds / (1 if key[1] == "once" else steps) for key, seconds in spent.items() if key[1] != "all"}
    # Lightning's calling of the hooks: its time less the hooks' own (with their timers), shared out to HookTimer too.
    hooks = sum(spent[key] + calls[key] * overhead for key in spent if key[0] in callbacks)
    dispatch_seconds = (spent[("dispatch", "all")] - hooks) * len(callbacks) / (len(callbacks) + 1)
    costs[("Lightning calling the callbacks' hooks", "step")] = dispatch_seconds / steps
    return costs, timer.per_step, len(callbacks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6)
    options = parser.parse_args()
    sys.argv = sys.argv[:1]
    overhead = timer_cost()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(options.rounds):
            runs.append(one_run(f"{tmp}/{round_}", options.epochs, overhead))
            print(f"round {round_ + 1}: {runs[-1][1] * 1e3:.2f} ms per step", flush=True)
    step = statistics.median(per_step for _, per_step, _ in runs)

    def median(feature: str, kind: str) -> float:
        return statistics.median(costs.get((feature, kind), 0.0) for costs, _, _ in runs)

    features = {feature for costs, _, _ in runs for feature, _ in costs}
    rows = sorted(((median(f, "step") + median(f, "epoch"), f) for f in features), reverse=True)
    print(f"\nthe default digits run: {step * 1e3:.2f} ms per optimizer step (validation and epoch ends included), "
          f"{runs[0][2]} callbacks; a timer costs {overhead * 1e9:.0f} ns, taken off")  # fmt: skip
    print("| feature | batch hooks, per step | epoch and validation hooks, per step | share of a step | once a run |")
    print("| --- | --- | --- | --- | --- |")
    for cost, feature in rows:
        print(f"| {feature} | {median(feature, 'step') * 1e6:.1f} us | {median(feature, 'epoch') * 1e6:.1f} us | "
              f"{cost / step:.2%} | {median(feature, 'once') * 1e3:.1f} ms |")  # fmt: skip
    total = sum(cost for cost, _ in rows)
    print(f"| all of the above | | | {total / step:.2%} ({total * 1e6:.0f} us) | |")


if __name__ == "__main__":
    main()
