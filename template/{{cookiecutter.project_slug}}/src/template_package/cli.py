"""The command line: `python -m template_package fit|validate|test|predict [--config FILE ...] [--key value ...]`.

LightningCLI builds the model, the DataModule and the Trainer from `configs/default.yaml` plus any `--config` presets
and flags, and saves the resolved config into the run directory. This module adds what the run-directory contract
needs: `--trainer.default_root_dir DIR` holds `DIR/checkpoints/last.ckpt`, `DIR/config.yaml` and the TensorBoard
events, and `fit --ckpt_path last` resumes that run, or starts it when there is nothing to resume yet.
"""

import os
import re
from argparse import ArgumentError
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from .callbacks import PredictionsCSV
from .checks import check_architecture, check_checkpoint, check_run_dir_writable, explain_parse_error
from .data import ImageDataModule
from .model import ImageClassifier
from .resume import LastCheckpoint

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
        accumulate = kwargs.get("accumulate_grad_batches", 1)
        if not isinstance(accumulate, int) or accumulate < 1:
            raise ValueError(f"trainer.accumulate_grad_batches={accumulate!r} must be a whole number >= 1")
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
    """Saves the resolved config as DIR/config.yaml once training starts: validate/test/predict leave it alone, and
    a fit that fails during set-up (a bad checkpoint, a warmup longer than the run) does not touch the run."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        pass

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().setup(trainer, pl_module, "fit")


class ProjectCLI(LightningCLI):
    """LightningCLI with the run-directory contract and the project's checkpoint callbacks."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Always present, configured under `checkpoint.*` and `last_checkpoint.*` (both in DIR/checkpoints), and
        # `predictions.*` (DIR/predictions.csv).
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.add_lightning_class_args(PredictionsCSV, "predictions")
        for key in ("checkpoint.dirpath", "last_checkpoint.dirpath"):
            parser.link_arguments("trainer.default_root_dir", key, compute_fn=checkpoint_dir)
        parser.link_arguments("trainer.default_root_dir", "predictions.path", compute_fn=predictions_csv)
        parser.link_arguments("trainer.default_root_dir", "trainer.logger.init_args.save_dir")
        # The network's shape follows the data.
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.in_channels", "model.in_channels", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """Parse, then check what was given, before LightningCLI reads a checkpoint or builds anything."""
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as error:
            raise SystemExit(f"error: {explain_parse_error(str(error), self.parser)}") from None
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand]
        if subcommand == "fit":
            check_run_dir_writable(Path(config.trainer.default_root_dir))
            resolve_resume(config)
        checkpoint = check_checkpoint(config.ckpt_path, config.weights_only) if config.ckpt_path else None
        if subcommand == "fit":
            purge_tensorboard_from(config, checkpoint["global_step"] if checkpoint else 0)

    def _check_architecture(self) -> None:
        """After the model is built: does the checkpoint fit it? One line instead of load_state_dict's page."""
        ckpt_path = self.config_init[self.subcommand].get("ckpt_path")
        if ckpt_path:
            check_architecture(ckpt_path, self.model)

    before_fit = before_validate = before_test = before_predict = _check_architecture


def resolve_resume(config) -> None:
    """Turn `--ckpt_path last` into this run's last.ckpt, and keep a fresh fit from overwriting a run."""
    last = Path(config.last_checkpoint.dirpath) / LastCheckpoint.FILENAME
    if config.ckpt_path == "last":
        if last.is_file():
            config.ckpt_path = str(last)
        else:
            print(f"fit --ckpt_path last: no {last} yet, starting a fresh run")
            config.ckpt_path = None
    elif config.ckpt_path is None and last.is_file():
        raise SystemExit(
            f"error: {last.parent.parent} already holds a run ({last}): resume it with --ckpt_path last, "
            "or give a new --trainer.default_root_dir"
        )


def purge_tensorboard_from(config, global_step: int) -> None:
    """TensorBoard hides what earlier processes logged in this run directory at `global_step` or later: what an
    interrupted run logged after its checkpoint, or, on a fresh start (0), everything a run killed before its first
    checkpoint logged. So no step appears twice. (With one optimizer the logger's step is the optimizer step.)"""
    logger = config.trainer.logger
    if getattr(logger, "class_path", "").endswith("TensorBoardLogger"):
        logger.init_args.purge_step = global_step


def checkpoint_dir(root_dir: str) -> str:
    return str(Path(root_dir) / "checkpoints")


def predictions_csv(root_dir: str) -> str:
    return str(Path(root_dir) / "predictions.csv")


# What a user can get wrong: printed as one line without a traceback (TRACEBACK=1 shows it).
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, FloatingPointError)


def main(args: list[str] | None = None) -> ProjectCLI:
    """Parse `args` (default: sys.argv) and run the subcommand."""
    try:
        return build_cli(args)
    except USER_ERRORS as error:
        if os.environ.get("TRACEBACK"):
            raise
        # Errors raised in loader workers arrive wrapped: their last line is the original message.
        lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
        message = re.sub(r"^\w+(Error|Exception): ", "", lines[-1])
        raise SystemExit(f"error: {message}") from None


def build_cli(args: list[str] | None, datamodule_class: type[L.LightningDataModule] = ImageDataModule) -> ProjectCLI:
    """The CLI without main's error handling; `datamodule_class` swaps in another DataModule (a benchmark's)."""
    defaults = {"default_config_files": [str(DEFAULT_CONFIG)], "exit_on_error": False}
    return ProjectCLI(
        ImageClassifier,
        datamodule_class,
        trainer_class=Trainer,
        save_config_callback=RunConfigCallback,
        save_config_kwargs={"overwrite": True},  # a resumed run rewrites its own config
        parser_kwargs={"exit_on_error": False, **{sub: defaults for sub in ("fit", "validate", "test", "predict")}},
        args=args,
        auto_configure_optimizers=False,
    )
