"""The engine's Trainer: Lightning's, with the defaults and guarantees of this project for any model and data.

- the engine's defaults, in its signature, so they hold for any config (one that names only your classes too): the run
  directory `runs/default`, 20 epochs unless `max_steps` is given, deterministic kernels, clipping by global norm at
  1.0, metrics every 10 steps, `precision="auto"` (see `auto_precision`); TF32 matmuls on CUDA;
- checkpoint files written atomically (durable.DurableCheckpointIO, unless a CheckpointIO plugin is given);
- the engine's own callbacks, whatever the config lists: exact resume (resume/exact_resume.py: last.ckpt, the
  generators, the train loader, signals, the run's lock; with `enable_checkpointing=False` it writes nothing), and the
  run's settings a module cannot see when it is built: its schedules' length and, when it optimizes manually, the
  configured clipping (run_settings.py);
- the checkpoint callbacks in the order Lightning expects: `trainer.checkpoint_callback` (what `ckpt_path="best"`
  reads) is the best checkpoints' ModelCheckpoint, before any the config adds, and `ExactResume` comes last;
- the model summary's FLOPs shown only where they were counted (report/summary.py), unless the config gives a
  summary callback of its own;
- each callback's batch hooks called only where its class implements them (internals.leave_out_empty_batch_hooks):
  Lightning calls every callback's six training-batch hooks at every batch, empty or not;
- a DataModule's prepare_data that leaves the global random generators and the multiprocessing start method as they
  were (data/preparing.py), so that the first run trains like every later one.
"""

import functools
from typing import Literal, Union, get_args, get_type_hints

import lightning as L
import torch
from lightning.fabric.plugins.io import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import ModelParallelStrategy

from ..data.preparing import forget_prepare_data, keep_global_state_in_prepare_data
from ..errors import UsageError
from ..internals import leave_out_empty_batch_hooks
from ..report.summary import ModelSummary
from ..resume.durable import DurableCheckpointIO
from ..resume.exact_resume import ExactResume
from .manual import keep_clipping_aside
from .monitor import BestCheckpoints
from .run_settings import RunSettings

# The engine's own callbacks: added to every run that does not list one of the same class (ExactResume to a run that
# checkpoints).
ENGINE_CALLBACKS = (ExactResume, RunSettings)
DEFAULT_EPOCHS = 20  # when neither max_epochs nor max_steps is given (Lightning's own: 1000)
# The precisions Lightning's Trainer takes, as its signature types them (without None).
PRECISION_INPUT = Union[tuple(kind for kind in get_args(get_type_hints(L.Trainer.__init__)["precision"])  # noqa: UP007
                              if kind is not type(None))]  # fmt: skip


def auto_precision() -> str:
    """bf16-mixed on CUDA GPUs that support it (Ampere and newer), 16-mixed with loss scaling on older ones,
    32-true on CPU, where mixed precision is slower than float32 for most models."""
    if not torch.cuda.is_available():
        return "32-true"
    return "bf16-mixed" if torch.cuda.is_bf16_supported(including_emulation=False) else "16-mixed"


def checkpoint_order(callback: L.Callback) -> int:
    """The engine's best checkpoints before any other ModelCheckpoint, ExactResume after every other callback."""
    kinds = (BestCheckpoints, ModelCheckpoint, ExactResume)
    return next((place for place, kind in enumerate(kinds, 1) if isinstance(callback, kind)), 0)


def _described(method, description: str):
    """`method` with this project's description, which `--help` shows (LightningCLI reads the subcommands' help and
    their options' help from the Trainer methods' docstrings)."""

    @functools.wraps(method)
    def described(self, *args, **kwargs):
        return method(self, *args, **kwargs)

    described.__doc__ = description
    return described


@functools.wraps(L.Trainer.fit)
def _fit(self: L.Trainer, model: L.LightningModule, *args, **kwargs) -> None:
    keep_clipping_aside(self, model)  # (Lightning refuses Trainer clipping for manual optimization)
    # The first run, which prepares the data, must train like every later one (data/preparing.py).
    owners = [model, *(arg for arg in (*args, *kwargs.values()) if isinstance(arg, L.LightningDataModule))]
    keep_global_state_in_prepare_data(owners)
    try:
        return L.Trainer.fit(self, model, *args, **kwargs)
    finally:
        forget_prepare_data(owners)


CHECKPOINT_TO_EVALUATE = """
    Args:
        ckpt_path: the checkpoint whose weights to use, e.g. runs/default/checkpoints/last.ckpt.
        weights_only: load the checkpoint without unpickling arbitrary objects (true by default); false only for a
            file you trust."""


class Trainer(L.Trainer):
    """Lightning's Trainer with `precision="auto"` (see `auto_precision`), TF32 matmuls on CUDA, checkpoint files
    written atomically (`durable.DurableCheckpointIO`, unless a CheckpointIO plugin is given) and the engine's own
    callbacks (ENGINE_CALLBACKS).

    Every other argument is Lightning's own; any Lightning precision string ("32-true", "bf16-mixed", "16-mixed",
    ...) is passed through unchanged. `enable_progress_bar=False` and `enable_checkpointing=False` also drop the
    progress bar and best-checkpoint callbacks that the config adds (ExactResume then writes nothing).

    Args:
        default_root_dir: the run directory: checkpoints/ (last.ckpt and the best by checkpoint.monitor),
            config.yaml and the TensorBoard events. `fit` refuses a directory that already holds a run unless it
            resumes it (--ckpt_path last), and a directory that another fit is training.
        max_epochs: the run's length in epochs; None: 20, or as many as max_steps takes when that is given.
        precision: "auto" (bf16-mixed on GPUs with bf16, 16-mixed on older GPUs, 32-true on CPU; a precision plugin
            given in `plugins` instead), or any Lightning precision string.
        gradient_clip_val: clip gradients at this value (by global norm: the total norm of all gradients), on
            unscaled gradients under 16-mixed; None or 0: no clipping. A module that optimizes manually applies it
            itself (README: Manual optimization).
        gradient_clip_algorithm: "norm" (the global norm) or "value" (each gradient element).
        deterministic: deterministic kernels, so that runs repeat and resume bit for bit; false lets cuDNN pick
            faster non-deterministic ones.
        log_every_n_steps: write the training metrics every this many training steps (at Lightning's 50, an epoch
            shorter than that logs nothing, and Lightning warns).
    """

    def __init__(
        self,
        *args,
        default_root_dir: str = "runs/default",
        max_epochs: int | None = None,
        precision: Literal["auto"] | PRECISION_INPUT = "auto",
        gradient_clip_val: int | float | None = 1.0,
        gradient_clip_algorithm: Literal["norm", "value"] | None = "norm",
        deterministic: bool | Literal["warn"] | None = True,
        log_every_n_steps: int | None = 10,
        **kwargs,
    ) -> None:
        accumulate = kwargs.get("accumulate_grad_batches", 1)
        if not isinstance(accumulate, int) or accumulate < 1:
            raise UsageError(f"trainer.accumulate_grad_batches={accumulate!r} must be a whole number >= 1")
        # Switching a feature off also drops its callbacks from the config, where Lightning would refuse the mix.
        for switch, kinds in (("enable_progress_bar", ProgressBar), ("enable_checkpointing", ModelCheckpoint)):
            if kwargs.get(switch) is False and kwargs.get("callbacks"):
                kwargs["callbacks"] = [c for c in kwargs["callbacks"] if not isinstance(c, kinds)]
        callbacks = list(kwargs.get("callbacks") or [])
        exact = [c for c in callbacks if isinstance(c, ExactResume)]  # one a run: the last (the CLI's, configured)
        callbacks = [c for c in callbacks if not isinstance(c, ExactResume) or c is exact[-1]]
        callbacks += [kind() for kind in ENGINE_CALLBACKS if not any(isinstance(c, kind) for c in callbacks)]
        if kwargs.get("enable_checkpointing") is False:  # the run stays exact and writes no checkpoint
            next(c for c in callbacks if isinstance(c, ExactResume)).writes = False
            kwargs["enable_checkpointing"] = True  # (Lightning refuses a Checkpoint callback otherwise)
        summary = kwargs.get("enable_model_summary")
        if summary is not False and not kwargs.get("barebones"):
            if not any(isinstance(c, LightningModelSummary) for c in callbacks):
                callbacks.append(ModelSummary())
            kwargs["enable_model_summary"] = False  # (Lightning would add its own, or say that it did not)
        # Lightning runs Checkpoint callbacks last, in their order, and its first ModelCheckpoint is the run's
        # `checkpoint_callback`: the run's best checkpoints (the CLI's `--checkpoint`) first, last.ckpt's last.
        kwargs["callbacks"] = sorted(callbacks, key=checkpoint_order)
        plugins = kwargs.get("plugins") or []
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
            kwargs["plugins"] = [*plugins, DurableCheckpointIO()]
        if torch.cuda.is_available():
            # TF32 tensor cores for float32 matmuls and convolutions on Ampere and newer GPUs: faster, and
            # deterministic; float32's range with a shorter mantissa, which training tolerates.
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        asked = precision
        if precision == "auto":  # a precision plugin given in `plugins` decides by itself
            precision = None if any(isinstance(p, Precision) for p in plugins) else auto_precision()
        if isinstance(kwargs.get("strategy"), ModelParallelStrategy) and precision in ("16-mixed", "16"):
            raise UsageError(
                f"trainer.precision={asked!r}{' is 16-mixed on this GPU, without bf16' if asked == 'auto' else ''}: "
                "sharded training (configs/fsdp.yaml) has no loss scaler for float16; give --trainer.precision "
                "32-true, or bf16-mixed on a GPU with bf16"
            )
        if max_epochs is None and kwargs.get("max_steps", -1) in (None, -1):
            max_epochs = DEFAULT_EPOCHS
        super().__init__(
            *args, default_root_dir=default_root_dir, max_epochs=max_epochs, precision=precision,
            gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm,
            deterministic=deterministic, log_every_n_steps=log_every_n_steps, **kwargs,
        )  # fmt: skip
        # Lightning calls every callback's batch hooks at every batch: only those a callback implements are called.
        leave_out_empty_batch_hooks(self.callbacks)

    fit = _described(
        _fit,
        """Train the model in the run directory --trainer.default_root_dir.

    Args:
        ckpt_path: last: resume the run from its checkpoints/last.ckpt, exactly, or start it when there is none yet
            (one command for the first start and every restart); a .ckpt path: continue from that checkpoint's full
            state (weights, optimizer, schedule, loop and data position).
        weights_only: load the checkpoint without unpickling arbitrary objects (true by default); false only for a
            file you trust.""",
    )
    validate = _described(
        L.Trainer.validate,
        f"""Compute the validation metrics of a checkpoint (the model's validation_step) on the validation set.
{CHECKPOINT_TO_EVALUATE}
        verbose: print the results.""",
    )
    test = _described(
        L.Trainer.test,
        f"""Compute the test metrics of a checkpoint (the model's test_step) on the test set.
{CHECKPOINT_TO_EVALUATE}
        verbose: print the results.""",
    )
    predict = _described(
        L.Trainer.predict,
        f"""Write predictions.csv into the run directory: what the model's predict_step returns for each input.
{CHECKPOINT_TO_EVALUATE}
        return_predictions: keep the predictions in memory too (they are written to the CSV file either way).""",
    )
