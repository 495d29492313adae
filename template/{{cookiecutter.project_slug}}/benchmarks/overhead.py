"""What the Trainer costs on top of a hand-written loop: `python benchmarks/overhead.py [--features off]`.

Runs the project's Trainer (configured by the CLI from configs/default.yaml) and benchmarks/reference_loop.py on
the same model, data and recipe, interleaved A B A B so that machine noise hits both alike, and prints the median
time per optimizer step of each. The last line is `overhead ratio <Trainer / reference>`. Steps are timed after
the first epoch, which pays the one-off costs (allocator warm-up, torch.compile).

--features on (default): logging, progress bar and checkpointing as configured. --features off: none of them.
Validation is off in both, since the reference loop does not validate.

--gpu: a torchvision ResNet-18 on CIFAR-sized random 3x32x32 images held in memory (no download), batch 256, on
one CUDA GPU, also reporting samples/s and peak GPU memory. Add --precision 16-mixed, --channels-last, --compile
to measure those switches (`model.channels_last`, `model.compile`). --config FILE adds a preset to the Trainer
run (e.g. configs/fast.yaml); global torch settings it makes, such as deterministic mode, hold for both.
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
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference_loop  # noqa: E402

from template_package.cli import auto_precision, build_cli  # noqa: E402
from template_package.data import ImageDataModule  # noqa: E402
from template_package.model import ImageClassifier  # noqa: E402

WAIT_SHARES: list[float] = []


class RandomImages(ImageDataModule):
    """CIFAR-10-sized stand-in for the GPU benchmark: 50,000 random RGB images and labels, in memory. (The epoch
    length matters: the epoch-end checkpoint is a per-epoch cost.)"""

    @property
    def in_channels(self) -> int:
        return 3

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(0)
        n, side = 50_000, self.hparams.image_size
        images = torch.rand(n, 3, side, side, generator=generator)
        dataset = TensorDataset(images, torch.randint(0, self.num_classes, (n,), generator=generator))
        self.datasets = dict.fromkeys(("train", "val", "test", "predict"), dataset)


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class StepTimer(L.Callback):
    """Wall time per optimizer step from the end of the first epoch to the end of training."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == 0 and trainer.is_last_batch:
            synchronize()
            self.start, self.start_step = time.perf_counter(), trainer.global_step

    def on_train_end(self, trainer, pl_module) -> None:
        synchronize()
        self.seconds_per_step = (time.perf_counter() - self.start) / (trainer.global_step - self.start_step)


def trainer_seconds_per_step(options: argparse.Namespace, root: str) -> float:
    args = ["fit", *(f"--config={path}" for path in options.config)]
    args += [f"--trainer.max_epochs={options.epochs}", f"--trainer.default_root_dir={root}"]
    args += ["--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0"]
    args += ["--trainer.enable_model_summary=false"]
    args += [f"--{key}={value}" for key, value in model_and_data_args(options).items()]
    timer = f"{StepTimer.__module__}.StepTimer"
    if options.features == "on":
        args += [f"--trainer.callbacks+={timer}"]
    else:
        args += [f"--trainer.callbacks=[{timer}]", "--trainer.logger=false"]
        args += ["--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false"]
    cli = build_cli(args, RandomImages if options.gpu else ImageDataModule)
    wait_share = cli.trainer.callback_metrics.get("perf/data_wait_share")  # from the Throughput callback
    if wait_share is not None:
        WAIT_SHARES.append(float(wait_share))
    return next(c for c in cli.trainer.callbacks if isinstance(c, StepTimer)).seconds_per_step


def model_and_data_args(options: argparse.Namespace) -> dict[str, object]:
    args: dict[str, object] = {"trainer.precision": options.precision, "data.batch_size": options.batch_size}
    if options.gpu:
        args |= {"trainer.accelerator": "gpu", "trainer.devices": 1, "model.arch": options.arch, "data.image_size": 32}
    if options.num_workers is not None:
        args["data.num_workers"] = options.num_workers
    return args | {"model.channels_last": options.channels_last, "model.compile": options.compile}


def reference_seconds_per_step(options: argparse.Namespace) -> float:
    L.seed_everything(42)
    data = (RandomImages if options.gpu else ImageDataModule)(
        batch_size=options.batch_size, image_size=32, num_workers=options.num_workers
    )
    net = copy.deepcopy(ImageClassifier(options.arch, data.num_classes, data.in_channels).net)
    if options.compile:
        net.compile()
    data.setup("fit")
    loader = data.train_dataloader()
    steps_per_epoch, timing = len(loader), {}

    def on_step(step: int) -> None:
        if step == steps_per_epoch:
            synchronize()
            timing["start"] = time.perf_counter()

    precision = auto_precision() if options.precision == "auto" else options.precision
    memory_format = torch.channels_last if options.channels_last else torch.contiguous_format
    device = "cuda" if options.gpu else "cpu"
    steps = reference_loop.train(
        net, loader, epochs=options.epochs, precision=precision, device=device, memory_format=memory_format,
        on_step=on_step,
    )  # fmt: skip
    synchronize()
    return (time.perf_counter() - timing["start"]) / (len(steps) - steps_per_epoch)


def peak_memory_mib() -> float:
    """Peak GPU memory since the last call, in MiB."""
    peak = torch.cuda.max_memory_allocated() / 2**20
    torch.cuda.reset_peak_memory_stats()
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", choices=["on", "off"], default="on")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--gpu", action="store_true", help="ResNet-18 on random 32x32 images on one CUDA GPU")
    parser.add_argument("--precision", default="auto", help="trainer.precision, e.g. bf16-mixed, 16-mixed")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--num-workers", type=int, default=None, help="data.num_workers (default: the project's)")
    parser.add_argument("--config", action="append", default=[], help="a Trainer preset, e.g. configs/fast.yaml")
    options = parser.parse_args()
    options.arch, options.batch_size = ("resnet18", 256) if options.gpu else ("small_cnn", 64)
    sys.argv = sys.argv[:1]  # LightningCLI gets its arguments from the list built here, not from this command line
    torch.set_num_threads(torch.get_num_threads())  # the same thread pool for both
    times: dict[str, list[float]] = {"trainer": [], "reference": []}
    memory: dict[str, list[float]] = {"trainer": [], "reference": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(options.repeats + 1):  # repeat 0 warms up caches and is not counted
            t = trainer_seconds_per_step(options, f"{tmp}/run{repeat}")
            t_memory = peak_memory_mib() if options.gpu else 0.0
            r = reference_seconds_per_step(options)
            r_memory = peak_memory_mib() if options.gpu else 0.0
            if repeat:
                for side, seconds, mib in (("trainer", t, t_memory), ("reference", r, r_memory)):
                    times[side].append(seconds)
                    memory[side].append(mib)
                print(f"repeat {repeat}: trainer {t * 1e3:.3f} ms/step, reference {r * 1e3:.3f} ms/step", flush=True)
    for side in ("trainer", "reference"):
        median = statistics.median(times[side])
        line = f"{side:9} median {median * 1e3:.3f} ms/step, {options.batch_size / median:,.0f} samples/s"
        print(line + (f", peak GPU memory {max(memory[side]):,.0f} MiB" if options.gpu else ""))
    ratios = [t / r for t, r in zip(times["trainer"], times["reference"], strict=True)]
    switches = [f"features {options.features}", f"precision {options.precision}"]
    switches += [name for name in ("gpu", "channels_last", "compile") if getattr(options, name)] + options.config
    print(f"ratio spread {min(ratios):.3f}..{max(ratios):.3f} ({', '.join(switches)})")
    if WAIT_SHARES:
        print(f"data wait share (last logged window) median {statistics.median(WAIT_SHARES):.1%}")
    print(f"overhead ratio {statistics.median(times['trainer']) / statistics.median(times['reference']):.3f}")


if __name__ == "__main__":
    main()
