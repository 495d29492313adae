"""What each of the template's features costs per optimizer step: `python benchmarks/feature_costs.py`.

benchmarks/overhead.py measures the template against Lightning's floor on the real digits step (~8 ms on 2 CPU
cores), where a feature's tens of microseconds drown in the machine's noise. Here the step is made tiny (batches of
one digit: the network's own work is ~0.5 ms), so that what the Trainer does around it stands out, and every
configuration runs in rotation (bare Lightning, the template, the template without one feature, ...) so that drift
hits them alike. The table gives each feature's cost in microseconds per step (the template's time per step less the
time without it, median over the rounds) and as a share of the default digits step, timed with the hand-written loop.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import WITHOUT, fit_bare, reference_epochs, trainer_args  # noqa: E402

from template_package.cli import build_cli  # noqa: E402


def seconds_per_step(options: argparse.Namespace, root: str, features: str, without: list[str]) -> float:
    """Wall time per optimizer step of a fit of `options.epochs` epochs, its first epoch excluded."""
    from lightning import Callback

    class StepTimer(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch == 0:
                self.start, self.start_step = time.perf_counter(), trainer.global_step

        def on_train_end(self, trainer, pl_module):
            self.per_step = (time.perf_counter() - self.start) / (trainer.global_step - self.start_step)

    run = argparse.Namespace(**{**vars(options), "features": features, "without": without})
    timer = f"{__name__}.StepTimer"
    sys.modules[__name__].StepTimer = StepTimer  # for the CLI to find it by name
    if features == "bare":
        trainer = fit_bare(run, root, callbacks=[StepTimer()])
    else:
        trainer = build_cli(trainer_args(run, root, options.epochs, [timer])).trainer
    return next(c for c in trainer.callbacks if isinstance(c, StepTimer)).per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2, help="epochs of 1,257 one-digit steps")
    options = parser.parse_args()
    sys.argv = sys.argv[:1]
    options.gpu, options.arch, options.compile, options.channels_last = False, "small_cnn", False, False
    options.precision, options.num_workers, options.config = "32-true", 0, []
    options.batch_size = 1
    configurations = {"bare": ("bare", []), "template": ("on", [])}
    configurations |= {f"without {feature}": ("on", [feature]) for feature in sorted(WITHOUT)}
    times: dict[str, list[float]] = {name: [] for name in configurations}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(options.rounds):
            for name, (features, without) in configurations.items():
                folder = f"{tmp}/{round_}-{name.replace(' ', '-')}"
                times[name].append(seconds_per_step(options, folder, features, without))
            print(
                f"round {round_ + 1}: " + ", ".join(f"{n} {t[-1] * 1e6:.0f} us" for n, t in times.items()), flush=True
            )
        # The default digits step (batch 64), timed with the hand-written loop.
        options.batch_size = 64
        epochs = reference_epochs(options, 3)
        next(epochs)
        start = time.perf_counter()
        steps = sum(len(next(epochs)) for _ in range(2))
        digits_step = (time.perf_counter() - start) / steps
    median = {name: statistics.median(values) for name, values in times.items()}
    bare, template = median["bare"] * 1e6, median["template"] * 1e6
    print(f"\nper optimizer step: bare Lightning {bare:.0f} us, the template {template:.0f} us; a default digits step "
          f"takes {digits_step * 1e3:.2f} ms (hand-written loop)")  # fmt: skip
    print("| feature | cost per step | share of a digits step |\n| --- | --- | --- |")
    for feature in sorted(WITHOUT):
        cost = median["template"] - median[f"without {feature}"]
        print(f"| {feature} | {cost * 1e6:.0f} us | {cost / digits_step:.2%} |")
    rest = median["template"] - median["bare"]
    print(f"| the template in all (over bare Lightning) | {rest * 1e6:.0f} us | {rest / digits_step:.2%} |")


if __name__ == "__main__":
    main()
