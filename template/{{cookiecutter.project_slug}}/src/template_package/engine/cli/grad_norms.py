"""`python -m template_package grad_norms [--steps N] [fit options]`: how large the gradients are, to pick
`trainer.gradient_clip_val` the way the training-loop guides do: train a few steps without clipping and look at
the distribution of the total gradient norm (the norm that clipping by norm compares with the clip value).

Prints the median, the 90th percentile and the maximum over the steps, and suggests a clip value at the 90th
percentile: it leaves ordinary steps alone and tames the spikes. The run is a throwaway one in a temporary folder;
fit options (`-c configs/bf16.yaml`, `--model.lr ...`) make it the run you mean to train.
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.callbacks import Callback

from .help import program
from .main import main as cli


class GradNormRecorder(Callback):
    """Collects the model's total gradient norm after every optimizer step (computed there with
    `log_every_n_steps=1`: see ImageClassifier.configure_gradient_clipping)."""

    def __init__(self) -> None:
        self.norms: list[float] = []
        self._step = 0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if trainer.global_step > self._step:  # an optimizer step (not a batch inside an accumulation window)
            self.norms.append(float(pl_module.grad_norm))
            self._step = trainer.global_step


def report(norms: list[float]) -> str:
    p90 = statistics.quantiles(norms, n=10, method="inclusive")[-1]
    return (
        f"total gradient norm before clipping, {len(norms)} optimizer steps: median {statistics.median(norms):.4g}, "
        f"p90 {p90:.4g}, max {max(norms):.4g}\n"
        f"to clip the spikes only: --trainer.gradient_clip_val {p90:.2g}"
    )


def main(argv: list[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(prog=f"{program()} grad_norms", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="optimizer steps to measure (default: 50)")
    args, fit_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    recorder = {"trainer": {"callbacks+": [{"class_path": f"{__name__}.GradNormRecorder"}]}}
    unclipped = ["--trainer.gradient_clip_val=null", "--trainer.log_every_n_steps=1", "--trainer.limit_val_batches=0"]
    throwaway = [
        "--trainer.enable_checkpointing=false",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
    ]
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "recorder.yaml"
        config.write_text(yaml.safe_dump(recorder))
        steps = f"--trainer.max_steps={args.steps}"
        run = cli(["fit", *fit_args, "-c", str(config), f"--trainer.default_root_dir={folder}/run", steps, *unclipped,
                   *throwaway])  # fmt: skip
    norms = next(c for c in run.trainer.callbacks if isinstance(c, GradNormRecorder)).norms
    print(report(norms))
    return norms


if __name__ == "__main__":
    main()
