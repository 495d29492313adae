"""The command line: `python -m template_package fit|validate|test|predict [--config FILE ...] [--key value ...]`.

LightningCLI builds the model, the DataModule and the Trainer from `configs/default.yaml` plus any `--config` presets
and flags, and saves the resolved config into the run directory. This module adds what the run-directory contract
needs: `--trainer.default_root_dir DIR` holds `DIR/checkpoints/last.ckpt`, `DIR/config.yaml` and the TensorBoard
events, and `fit --ckpt_path last` resumes that run, or starts it when there is nothing to resume yet.
"""

from pathlib import Path
from typing import Literal

import lightning as L
import torch
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from .callbacks import LastCheckpoint
from .data import ImageDataModule
from .model import ImageClassifier

# The packaged defaults; found beside the source tree of an editable install (`pip install -e .`).
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"


def auto_precision() -> str:
    """bf16-mixed on CUDA GPUs that support it (Ampere and newer), 16-mixed with loss scaling on older ones,
    32-true on CPU, where mixed precision is slower than float32 for most models."""
    if not torch.cuda.is_available():
        return "32-true"
    return "bf16-mixed" if torch.cuda.is_bf16_supported(including_emulation=False) else "16-mixed"


CHECKPOINT_CALLBACKS = (ModelCheckpoint, LastCheckpoint)


class Trainer(L.Trainer):
    """Lightning's Trainer with `precision="auto"` (see `auto_precision`) and TF32 matmuls on CUDA.

    Every other argument is Lightning's own; any Lightning precision string ("32-true", "bf16-mixed", "16-mixed",
    ...) is passed through unchanged. `enable_progress_bar=False` and `enable_checkpointing=False` also drop the
    progress bar and checkpoint callbacks that the config adds.
    """

    def __init__(self, *args, precision: Literal["auto"] | _PRECISION_INPUT = "auto", **kwargs) -> None:
        # Switching a feature off also drops its callbacks from the config, where Lightning would refuse the mix.
        for switch, kinds in (("enable_progress_bar", ProgressBar), ("enable_checkpointing", CHECKPOINT_CALLBACKS)):
            if kwargs.get(switch) is False and kwargs.get("callbacks"):
                kwargs["callbacks"] = [c for c in kwargs["callbacks"] if not isinstance(c, kinds)]
        if torch.cuda.is_available():
            # TF32 tensor cores for float32 matmuls and convolutions: ~8x faster on Ampere+, deterministic.
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        super().__init__(*args, precision=auto_precision() if precision == "auto" else precision, **kwargs)


class RunConfigCallback(SaveConfigCallback):
    """Saves the resolved config as DIR/config.yaml when fitting, so validate/test/predict leave it alone."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            super().setup(trainer, pl_module, stage)


class ProjectCLI(LightningCLI):
    """LightningCLI with the run-directory contract and the project's checkpoint callbacks."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Always present, configured under `checkpoint.*` and `last_checkpoint.*`, both in DIR/checkpoints.
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        for key in ("checkpoint.dirpath", "last_checkpoint.dirpath"):
            parser.link_arguments("trainer.default_root_dir", key, compute_fn=checkpoint_dir)
        parser.link_arguments("trainer.default_root_dir", "trainer.logger.init_args.save_dir")
        # The network's shape follows the data.
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.in_channels", "model.in_channels", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        if self.subcommand == "fit":
            self._resolve_resume(self.config.fit)

    @staticmethod
    def _resolve_resume(config) -> None:
        """Turn `--ckpt_path last` into this run's last.ckpt, and keep a fresh fit from overwriting a run."""
        last = Path(config.last_checkpoint.dirpath) / LastCheckpoint.FILENAME
        if config.ckpt_path == "last":
            if not last.is_file():
                print(f"fit --ckpt_path last: no {last} yet, starting a fresh run")
                config.ckpt_path = None
                return
            config.ckpt_path = str(last)
        elif config.ckpt_path is None and last.is_file():
            raise SystemExit(
                f"error: {last.parent.parent} already holds a run ({last}): resume it with --ckpt_path last, "
                "or give a new --trainer.default_root_dir"
            )
        logger = config.trainer.logger
        if config.ckpt_path and getattr(logger, "class_path", "").endswith("TensorBoardLogger"):
            # TensorBoard drops what the interrupted run logged from the checkpoint's step on, so no step appears
            # twice. (With one optimizer the logger's step is the optimizer step count.)
            checkpoint = torch.load(config.ckpt_path, map_location="cpu", weights_only=True, mmap=True)
            logger.init_args.purge_step = checkpoint["global_step"]


def checkpoint_dir(root_dir: str) -> str:
    return str(Path(root_dir) / "checkpoints")


def main(args: list[str] | None = None) -> ProjectCLI:
    """Parse `args` (default: sys.argv) and run the subcommand."""
    defaults = {"default_config_files": [str(DEFAULT_CONFIG)]}
    return ProjectCLI(
        ImageClassifier,
        ImageDataModule,
        trainer_class=Trainer,
        save_config_callback=RunConfigCallback,
        save_config_kwargs={"overwrite": True},  # a resumed run rewrites its own config
        parser_kwargs={subcommand: defaults for subcommand in ("fit", "validate", "test", "predict")},
        args=args,
        auto_configure_optimizers=False,
    )
