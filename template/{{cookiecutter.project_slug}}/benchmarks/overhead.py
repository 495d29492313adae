"""What the Trainer costs on top of a hand-written loop: `python benchmarks/overhead.py [--features off]`.

Runs the project's Trainer (configured by the CLI from configs/default.yaml) and benchmarks/reference_loop.py on
the same model, data and recipe, interleaved A B A B so that machine noise hits both alike, and prints the median
time per optimizer step of each. The last line is `overhead ratio <Trainer / reference>`.

--features on (default): logging, progress bar and checkpointing as configured. --features off: none of them.
Validation is off in both, since the reference loop does not validate.
"""

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference_loop  # noqa: E402

from template_package.cli import main as run_cli  # noqa: E402
from template_package.data import ImageDataModule  # noqa: E402
from template_package.model import ImageClassifier  # noqa: E402

WAIT_SHARES: list[float] = []


class StepTimer(L.Callback):
    """Wall time of the training loop itself, from the first batch to the end: no set-up, no teardown."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 0 and trainer.current_epoch == 0:
            self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module) -> None:
        self.seconds_per_step = (time.perf_counter() - self.start) / trainer.global_step


def trainer_seconds_per_step(epochs: int, features: bool, root: str) -> float:
    args = ["fit", f"--trainer.max_epochs={epochs}", f"--trainer.default_root_dir={root}"]
    args += [
        "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_model_summary=false",
    ]
    timer = f"{StepTimer.__module__}.StepTimer"
    if features:
        args += [f"--trainer.callbacks+={timer}"]
    else:
        args += [f"--trainer.callbacks=[{timer}]", "--trainer.logger=false"]
        args += ["--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false"]
    cli = run_cli(args)
    wait_share = cli.trainer.callback_metrics.get("perf/data_wait_share")  # from the Throughput callback
    if wait_share is not None:
        WAIT_SHARES.append(float(wait_share))
    return next(c for c in cli.trainer.callbacks if isinstance(c, StepTimer)).seconds_per_step


def reference_seconds_per_step(epochs: int) -> float:
    L.seed_everything(42)
    net = copy.deepcopy(ImageClassifier().net)
    data = ImageDataModule()
    data.setup("fit")
    loader = data.train_dataloader()
    start = time.perf_counter()
    losses = reference_loop.train(net, loader, epochs=epochs)
    return (time.perf_counter() - start) / len(losses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", choices=["on", "off"], default="on")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    sys.argv = sys.argv[:1]  # LightningCLI gets its arguments from run_cli's list, not from this command line
    torch.set_num_threads(torch.get_num_threads())  # the same thread pool for both
    trainer_times, reference_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats + 1):  # repeat 0 warms up caches and is not counted
            t = trainer_seconds_per_step(args.epochs, args.features == "on", f"{tmp}/run{repeat}")
            r = reference_seconds_per_step(args.epochs)
            if repeat:
                trainer_times.append(t)
                reference_times.append(r)
                print(f"repeat {repeat}: trainer {t * 1e3:.3f} ms/step, reference {r * 1e3:.3f} ms/step")
    ratios = [t / r for t, r in zip(trainer_times, reference_times, strict=True)]
    print(f"trainer   median {statistics.median(trainer_times) * 1e3:.3f} ms/step")
    print(f"reference median {statistics.median(reference_times) * 1e3:.3f} ms/step")
    print(f"ratio spread {min(ratios):.3f}..{max(ratios):.3f} (features {args.features})")
    if WAIT_SHARES:
        print(f"data wait share (last logged window) median {statistics.median(WAIT_SHARES):.1%}")
    print(f"overhead ratio {statistics.median(trainer_times) / statistics.median(reference_times):.3f}")


if __name__ == "__main__":
    main()
