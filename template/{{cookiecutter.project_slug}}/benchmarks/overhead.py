"""What the Trainer costs on top of a hand-written loop: `python benchmarks/overhead.py [--features off|template]`.

Runs the project's Trainer (configured by the CLI from configs/default.yaml) and benchmarks/reference_loop.py on
the same model, data and recipe, interleaved epoch by epoch (a Trainer epoch, then a reference epoch, ...) so that
machine noise hits both alike, and prints the median over repeats of the time per optimizer step of each. The last
line is `overhead ratio <x>`: the median over repeats of Trainer / reference, the two timed in the same fit. The
first epoch of each side pays the one-off costs (allocator warm-up, torch.compile) and is not timed; every later
epoch is, whole: its steps and its epoch-end work.

--features on (default): logging, progress bar and checkpointing as configured. --features off: none of them.
--features bare: Lightning's own floor, with nothing of the template but its model and recipe: the model without
its NaN check and logging, in `Trainer(barebones=True)`, built without the CLI. Validation is off in all of them,
since the reference loop does not validate. --features template: the template (on) against Lightning's floor (bare),
without the reference loop: per repeat a fit of each, on two threads that take turns step by step and train the same
network (Relay); the last line is `template overhead <x>`: each step's fastest time over the repeats, summed,
template / bare (the repeats' own ratios are printed for their spread). `--without FEATURE` (repeatable) drops a
feature from the template's side, to measure what it costs; `--null` puts Lightning's floor on both sides, the
control: its distance from 1 is what this machine's noise alone makes of the same work.

--gpu: a torchvision ResNet-18 on CIFAR-sized random 3x32x32 images held in memory (no download), batch 256, on
one CUDA GPU, also reporting samples/s and the peak GPU memory of each side run alone. Add --precision 16-mixed,
--channels-last, --compile to measure those switches (`model.channels_last`, `model.compile`). --config FILE adds
a preset to the Trainer run; global torch settings it makes, such as deterministic mode, hold for both.
`--gpu --config configs/fast.yaml` measures the GPU fast path (data held on the GPU, fused AdamW, CUDA graphs,
channels_last) against the plain hand-written loop (a loader from host memory, AdamW's default, no graphs): an
overhead ratio of 0.67 is 1.5x its samples/s.
"""

import argparse
import copy
import functools
import gc
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reference_loop  # noqa: E402

from template_package.classifier.data import ImageDataModule  # noqa: E402
from template_package.classifier.model import ImageClassifier  # noqa: E402
from template_package.engine.cli.main import build_cli  # noqa: E402
from template_package.engine.data.loaders import resumable_loader  # noqa: E402
from template_package.engine.report.throughput import Throughput  # noqa: E402
from template_package.engine.training.trainer import auto_precision  # noqa: E402


class RandomImages(ImageDataModule):
    """CIFAR-10-sized stand-in for the GPU benchmark: 50,000 random RGB images and labels, in memory. (The epoch
    length matters: an epoch's start and end are per-epoch costs.)"""

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


class Interleave(L.Callback):
    """Runs one epoch of the reference loop at the end of each Trainer epoch and times both sides.

    The Trainer's time is the wall time from the end of its first epoch to the end of training, less the reference
    epochs run inside it. (A Trainer cannot be paused between epochs from outside, so the reference runs in a hook.)
    """

    reference_epochs: Iterator[list[float]]  # set by the benchmark before each fit

    clock = staticmethod(time.perf_counter)  # --clock cpu: time.thread_time, this thread's CPU time

    def __init__(self) -> None:
        self.reference_seconds, self.reference_steps = 0.0, 0

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        synchronize()
        start = self.clock()
        steps = len(next(self.reference_epochs))
        synchronize()
        end = self.clock()
        if trainer.current_epoch == 0:  # both sides' first epochs: warm-up, not timed
            self.start, self.start_step = end, trainer.global_step
        else:
            self.reference_seconds += end - start
            self.reference_steps += steps

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        synchronize()
        trainer_seconds = self.clock() - self.start - self.reference_seconds
        self.trainer_seconds_per_step = trainer_seconds / (trainer.global_step - self.start_step)
        self.reference_seconds_per_step = self.reference_seconds / self.reference_steps


# The default run's callbacks, and what `--without` drops from the template's features to measure each one. (The
# engine's own, engine/training/trainer.py's ENGINE_CALLBACKS, are on every run: they make it exact.)
DEFAULT_CALLBACKS = {
    "progress_bar": "template_package.engine.report.progress.TimedProgressBar",
    "confusion_matrix": "template_package.engine.report.confusion.ConfusionMatrixImage",
    "throughput": "template_package.engine.report.throughput.Throughput",
}
WITHOUT = {
    "progress_bar": ["--trainer.enable_progress_bar=false"],
    "logging": ["--trainer.logger=false", "--trainer.log_every_n_steps=1000000"],
    "checkpointing": ["--trainer.enable_checkpointing=false"],
    "throughput": [],  # dropped from the callbacks, as this one
    "confusion_matrix": [],
}


def trainer_args(options: argparse.Namespace, root: str, epochs: int, callbacks: list[str]) -> list[str]:
    args = ["fit", *(f"--config={path}" for path in options.config)]
    args += [f"--trainer.max_epochs={epochs}", f"--trainer.default_root_dir={root}"]
    args += ["--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0"]
    args += ["--trainer.enable_model_summary=false"]
    args += [f"--{key}={value}" for key, value in model_and_data_args(options).items()]
    if options.features == "on":
        kept = [path for name, path in DEFAULT_CALLBACKS.items() if name not in options.without]
        args += [f"--trainer.callbacks=[{', '.join(kept + callbacks)}]"]
        for feature in options.without:
            args += WITHOUT[feature]
    else:
        args += [f"--trainer.callbacks=[{', '.join(callbacks)}]", "--trainer.logger=false"]
        args += ["--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false"]
    return args


def model_and_data_args(options: argparse.Namespace) -> dict[str, object]:
    args: dict[str, object] = {"data": f"{RandomImages.__module__}.RandomImages"} if options.gpu else {}
    args |= {"trainer.precision": options.precision, "data.batch_size": options.batch_size}
    if options.gpu:
        args |= {"trainer.accelerator": "gpu", "trainer.devices": 1, "model.arch": options.arch, "data.image_size": 32}
    if options.num_workers is not None:
        args["data.num_workers"] = options.num_workers
    # Given only when switched on here, so that a --config preset's own switches hold (configs/fast.yaml).
    return args | {f"model.{name}": True for name in ("channels_last", "compile") if getattr(options, name)}


def datamodule(options: argparse.Namespace) -> ImageDataModule:
    """The data of the reference loop and of the bare Trainer; the CLI builds the same from model_and_data_args."""
    data_class = RandomImages if options.gpu else ImageDataModule
    return data_class(batch_size=options.batch_size, image_size=32, num_workers=options.num_workers)


def precision(options: argparse.Namespace) -> str:
    return auto_precision() if options.precision == "auto" else options.precision


def engine_train_loader(data: ImageDataModule):
    """The train loader as the engine's Trainer rebuilds it (engine/data/loaders.py): the reference loop and the bare
    Trainer read the same batches, the same way."""
    return resumable_loader(data.train_dataloader(), torch.initial_seed(), epoch=0)


def reference_epochs(options: argparse.Namespace, epochs: int) -> Iterator[list[float]]:
    """The reference loop on its own copy of the model (the same initial weights) and data, one epoch per next()."""
    L.seed_everything(42)
    data = datamodule(options)
    net = copy.deepcopy(ImageClassifier(options.arch, data.num_classes, data.in_channels).net)
    if options.compile:
        net.compile()
    data.setup("fit")
    memory_format = torch.channels_last if options.channels_last else torch.contiguous_format
    return reference_loop.train_epochs(
        net, engine_train_loader(data), epochs=epochs, precision=precision(options),
        device="cuda" if options.gpu else "cpu", memory_format=memory_format,
    )  # fmt: skip


def fit_interleaved(options: argparse.Namespace, root: str) -> tuple[float, float, float | None]:
    """One Trainer fit with a reference epoch after each of its epochs: the seconds per optimizer step of each, and
    the data-wait share the Throughput callback logged last (None without it)."""
    Interleave.reference_epochs = reference_epochs(options, options.epochs)
    if options.features == "bare":
        trainer = fit_bare(options, root)
    else:
        interleave = f"{Interleave.__module__}.{Interleave.__name__}"
        args = trainer_args(options, root, options.epochs, [interleave])
        trainer = build_cli(args).trainer
    timer = next(c for c in trainer.callbacks if isinstance(c, Interleave))
    throughput = next((c for c in trainer.callbacks if isinstance(c, Throughput)), None)
    wait_share = throughput.latest.get("perf/data_wait_share") if throughput else None
    return timer.trainer_seconds_per_step, timer.reference_seconds_per_step, wait_share and float(wait_share)


class BareClassifier(ImageClassifier):
    """The project's network, optimizer and LR schedule, without the recipe's NaN check, logging and diagnostics:
    Lightning's own hooks."""

    on_before_backward = L.LightningModule.on_before_backward
    on_train_batch_end = L.LightningModule.on_train_batch_end
    configure_gradient_clipping = L.LightningModule.configure_gradient_clipping

    def training_step(self, batch, batch_idx):
        images, targets = batch
        return F.cross_entropy(self(images), targets)


def fit_bare(options: argparse.Namespace, root: str, callbacks: list[L.Callback] | None = None) -> L.Trainer:
    """The recipe of configs/default.yaml in `Trainer(barebones=True)`, which skips Lightning's logging, progress and
    checkpointing machinery: what any Lightning training loop costs at least."""
    data = datamodule(options)
    L.seed_everything(42)
    model = BareClassifier(
        options.arch, data.num_classes, data.in_channels, compile=options.compile, channels_last=options.channels_last
    )
    trainer = L.Trainer(
        barebones=True, max_epochs=options.epochs, gradient_clip_val=1.0, deterministic=True,
        callbacks=callbacks if callbacks is not None else [Interleave()],
        precision=precision(options), default_root_dir=root,
        accelerator="gpu" if options.gpu else "cpu", devices=1, limit_val_batches=0,
    )  # fmt: skip
    data.setup("fit")
    trainer.fit(model, train_dataloaders=engine_train_loader(data), val_dataloaders=data.val_dataloader())
    return trainer


def peak_memory_mib(options: argparse.Namespace, root: str) -> tuple[float, float]:
    """Peak GPU memory of one epoch of each side, run alone (interleaved, each would count the other's weights)."""
    peaks = []
    for run in (
        lambda: build_cli(trainer_args(options, root, 1, [])),
        lambda: next(reference_epochs(options, 1)),
    ):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        run()
        peaks.append(torch.cuda.max_memory_allocated() / 2**20)
    return peaks[0], peaks[1]


class Relay:
    """Two fits on two threads that take turns step by step: one runs while the other waits, so the template's steps
    and Lightning's floor's alternate in one process, and the machine's changes of speed (a CPU shared with other
    machines runs the same step up to 15% slower or faster from one step to the next) hit both alike."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self.turn = {side: threading.Semaphore(0) for side in SIDES}
        self.seconds: dict[str, list[float]] = {side: [] for side in SIDES}  # each timed step's, in order
        self.done: set[str] = set()
        self.failed: BaseException | None = None
        self.network: torch.nn.Module | None = None  # the first fit's, which the other one trains too

    def hand_over(self, side: str) -> None:
        """`side` gives the CPU to the other fit, and waits for its turn back unless the other has ended."""
        other = next(s for s in SIDES if s != side)
        if other not in self.done:
            self.turn[other].release()
            self.turn[side].acquire()

    def run(self, side: str, fit) -> None:
        self.turn[side].acquire()
        try:
            fit()
        except BaseException as error:  # (raised again by the benchmark's main thread)
            self.failed = error
        finally:
            self.done.add(side)
            self.turn[next(s for s in SIDES if s != side)].release()


SIDES = ("template", "bare")


class Turn(L.Callback):
    """Times its fit's steps after the first epoch (warm-up) and hands over to the other fit after each. A turn runs
    from taking it back to the end of the next training batch: every hook, epoch end and logging in between."""

    relay: Relay  # set by the benchmark before each pair of fits
    side = "bare"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """The second fit trains the first one's network (the same tensors, so the same memory layout), built before
        its optimizer is."""
        if self.relay.network is not None:
            pl_module.net = self.relay.network

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        relay = self.relay
        relay.network = relay.network or pl_module.net
        if trainer.current_epoch > 0:
            relay.seconds[self.side].append(relay.clock() - self.taken)
        relay.hand_over(self.side)
        self.taken = relay.clock()


class TemplateTurn(Turn):
    side = "template"


def fit_template_turns(options: argparse.Namespace, root: str) -> None:
    if options.null:  # the control: Lightning's floor on the template's turns too
        fit_bare(options, root, callbacks=[TemplateTurn()])
        return
    template = argparse.Namespace(**{**vars(options), "features": "on"})
    build_cli(trainer_args(template, root, options.epochs, [f"{TemplateTurn.__module__}.{TemplateTurn.__name__}"]))


def fit_bare_turns(options: argparse.Namespace, root: str) -> None:
    fit_bare(options, root, callbacks=[Turn()])


def template_overhead(options: argparse.Namespace) -> None:
    """--features template: per repeat, the template as configured (features on) and bare Lightning, each a fit on
    its own thread, their steps alternating (Relay); the ratio of their times per step is what the template costs
    over Lightning's own floor. Both train the same network (the same tensors): its memory layout, which changes a
    convolution's speed by a few percent from one process to the next, is the same for both. Each side goes first in
    half the repeats, so that whatever going first costs falls on both alike.

    Every repeat does the same work at each step (the same seed, data and schedule), and the machine's noise only ever
    adds time, so the figure is each step's fastest time over the repeats, summed, template / bare (as timeit takes
    the fastest of its repeats): a cost of the template at some steps only (a log write, an epoch's end) is at the
    same steps in every repeat and counted whole. The repeats' own ratios are printed for their spread."""
    ratios, times = [], {side: [] for side in SIDES}
    clock = time.thread_time if options.clock == "cpu" else time.perf_counter
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(1, options.repeats + 1):
            Turn.relay = relay = Relay(clock)
            fits = {"template": functools.partial(fit_template_turns, options, f"{tmp}/t{repeat}"),
                    "bare": functools.partial(fit_bare_turns, options, f"{tmp}/b{repeat}")}  # fmt: skip
            threads = [threading.Thread(target=relay.run, args=(side, fits[side])) for side in SIDES]
            relay.turn[SIDES[repeat % 2]].release()  # each side first in half the repeats
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if relay.failed:
                raise relay.failed
            per_step = {side: statistics.fmean(relay.seconds[side]) for side in SIDES}
            for side in SIDES:
                times[side].append(relay.seconds[side])
            ratios.append(per_step["template"] / per_step["bare"])
            print(f"repeat {repeat}: template {per_step['template'] * 1e3:.3f} ms/step, bare "
                  f"{per_step['bare'] * 1e3:.3f} ms/step, template / bare {ratios[-1]:.4f}", flush=True)  # fmt: skip
    fastest = {side: sum(map(min, zip(*times[side], strict=True))) for side in SIDES}
    without = f" without {', '.join(options.without)}" if options.without else ""
    without += ", null control: the floor on both sides" if options.null else ""
    print(f"repeats' ratios: median {statistics.median(ratios):.3f}, {min(ratios):.3f}..{max(ratios):.3f}")
    print(f"template overhead {fastest['template'] / fastest['bare']:.3f} (each step's fastest of {options.repeats} "
          f"repeats of {options.epochs} epochs, by turns, {options.clock} clock{without})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", choices=["on", "off", "bare", "template"], default="on")
    parser.add_argument("--without", action="append", default=[], choices=sorted(WITHOUT),
                        help="with --features template: a feature to drop, to measure what it costs")  # fmt: skip
    parser.add_argument("--null", action="store_true", help="with --features template: Lightning's floor on both sides")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="cpu: the training thread's CPU time, which other processes on the machine do not "
                        "inflate (work the engine moves to a background thread is then not counted)")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--gpu", action="store_true", help="ResNet-18 on random 32x32 images on one CUDA GPU")
    parser.add_argument("--precision", default="auto", help="trainer.precision, e.g. bf16-mixed, 16-mixed")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--num-workers", type=int, default=None, help="data.num_workers (default: the project's)")
    parser.add_argument("--config", action="append", default=[], help="a Trainer preset, e.g. configs/fast.yaml")
    options = parser.parse_args()
    options.arch, options.batch_size = ("resnet18", 256) if options.gpu else ("small_cnn", 64)
    if options.clock == "cpu":
        Interleave.clock = staticmethod(time.thread_time)
    sys.argv = sys.argv[:1]  # LightningCLI gets its arguments from the list built here, not from this command line
    if options.features == "template":
        return template_overhead(options)
    times: dict[str, list[float]] = {"trainer": [], "reference": []}
    wait_shares = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(1, options.repeats + 1):
            t, r, wait_share = fit_interleaved(options, f"{tmp}/run{repeat}")
            times["trainer"].append(t)
            times["reference"].append(r)
            wait_shares += [wait_share] if wait_share is not None else []
            print(f"repeat {repeat}: trainer {t * 1e3:.3f} ms/step, reference {r * 1e3:.3f} ms/step", flush=True)
        memory = peak_memory_mib(options, f"{tmp}/memory") if options.gpu else None
    for side, peak in zip(("trainer", "reference"), memory or (None, None), strict=True):
        median = statistics.median(times[side])
        line = f"{side:9} median {median * 1e3:.3f} ms/step, {options.batch_size / median:,.0f} samples/s"
        print(line + (f", peak GPU memory {peak:,.0f} MiB" if peak is not None else ""))
    ratios = [t / r for t, r in zip(times["trainer"], times["reference"], strict=True)]
    switches = [f"features {options.features}", f"precision {options.precision}"]
    switches += [name for name in ("gpu", "channels_last", "compile") if getattr(options, name)] + options.config
    print(f"ratio per repeat {min(ratios):.3f}..{max(ratios):.3f} ({', '.join(switches)})")
    if wait_shares:
        print(f"data wait share (last logged window) median {statistics.median(wait_shares):.1%}")
    print(f"overhead ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
