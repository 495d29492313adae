"""Clipping acts on unscaled gradients for every combination the engine offers: precision (32-true, bf16-mixed,
16-mixed with a GradScaler, bf16-true), AdamW default and fused, clipping by norm and by value, accumulation 1 and 3.

Under 16-mixed, Lightning skips GradScaler.unscale_ for optimizers that unscale inside their own step (fused AdamW),
and clipping by hand then saw gradients still multiplied by the loss scale (norms of ~87,000 instead of ~1.3): every
step clipped to almost nothing. On the CPU, 16-mixed is Lightning's MixedPrecision plugin given explicitly with the
CPU GradScaler (Lightning turns the string "16-mixed" into bf16 on a CPU)."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins.precision import MixedPrecision

from template_package.engine.data.loaders import resumable_loader
from template_package.engine.training.trainer import Trainer

from helpers.stand_in import StandInClassifier, StandInData

STEPS, CLIP = 4, 0.5


class Recorded(Logger):
    """Keeps what the recipe writes, step by step."""

    name, version = "recorded", 0

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, list[float]] = {}

    def log_metrics(self, metrics, step=None) -> None:
        for key, value in metrics.items():
            self.metrics.setdefault(key, []).append(value)

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none on this machine")


def precision_args(precision: str, device: str) -> dict:
    if precision == "16-mixed" and device == "cpu":
        return {"plugins": [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))]}
    return {"precision": precision}


def train(
    precision: str, fused: bool, algorithm: str = "norm", accumulate: int = 1, device: str = "cpu"
) -> tuple[Recorded, dict]:
    L.seed_everything(0)
    model = StandInClassifier(num_classes=10, in_channels=1, fused_optimizer=fused, warmup=1, lr=0.01)
    logger = Recorded()
    accelerator = "gpu" if device == "cuda" else "cpu"
    trainer = Trainer(accelerator=accelerator, devices=1, max_steps=STEPS, limit_val_batches=0, log_every_n_steps=1,
                      gradient_clip_val=CLIP, gradient_clip_algorithm=algorithm, accumulate_grad_batches=accumulate,
                      logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, **precision_args(precision, device))  # fmt: skip
    trainer.fit(model, datamodule=StandInData(batch_size=32))
    return logger, {k: v.float().cpu() for k, v in model.state_dict().items()}


def norm_by_hand(precision: str) -> float:
    """The total norm of the first step's unscaled gradients, computed without Lightning."""
    L.seed_everything(0)
    model = StandInClassifier(num_classes=10, in_channels=1)
    data = StandInData(batch_size=32)
    data.setup("fit")
    images, targets = next(iter(resumable_loader(data.train_dataloader(), torch.initial_seed(), epoch=0)))
    dtype = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}.get(precision)
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        F.cross_entropy(model(images), targets).backward()
    return torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()


def test_16_mixed_with_a_fused_optimizer_clips_unscaled_gradients():
    """The outside harness of the issue: the logged norm is the unscaled one (computed by hand), and the fused run
    learns what the unfused run learns, within float tolerance."""
    fused, fused_weights = train("16-mixed", fused=True)
    plain, plain_weights = train("16-mixed", fused=False)
    expected = norm_by_hand("16-mixed")
    assert fused.metrics["train/grad_norm"][0] == pytest.approx(expected, rel=1e-3)
    assert plain.metrics["train/grad_norm"][0] == pytest.approx(expected, rel=1e-3)
    assert expected > CLIP and fused.metrics["train/clip_share"][0] == 1.0  # the clip acted, on the real norm
    gap = max((fused_weights[k] - plain_weights[k]).abs().max().item() for k in plain_weights)
    moved = max((plain_weights[k] - train("16-mixed", fused=False, algorithm="norm")[1][k]).abs().max().item()
                for k in plain_weights)  # fmt: skip
    assert moved == 0.0 and gap < 1e-3, gap  # deterministic, and fused AdamW rounds a little differently


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 3])
@pytest.mark.parametrize("algorithm", ["norm", "value"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed", "bf16-true"])
def test_every_combination_clips_unscaled_gradients(precision, algorithm, accumulate, device="cpu"):
    results = {fused: train(precision, fused, algorithm, accumulate, device) for fused in (False, True)}
    (plain, plain_weights), (fused, fused_weights) = results[False], results[True]
    norms = {name: logger.metrics["train/grad_norm"] for name, logger in (("plain", plain), ("fused", fused))}
    assert len(norms["plain"]) == len(norms["fused"]) == STEPS
    assert max(norms["fused"]) < 100, norms  # unscaled: the scale is 65,536
    tolerance = 5e-2 if precision == "bf16-true" else 1e-3  # bf16 weights round to 3 significant digits
    assert norms["fused"][0] == pytest.approx(norms["plain"][0], rel=tolerance)
    assert max((fused_weights[k] - plain_weights[k]).abs().max().item() for k in plain_weights) < tolerance


@needs_cuda
@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 3])
@pytest.mark.parametrize("algorithm", ["norm", "value"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed", "bf16-true"])
def test_every_combination_clips_unscaled_gradients_on_cuda(precision, algorithm, accumulate):
    """The same on a GPU, where precision "auto" picks 16-mixed without bf16 (V100, T4, consumer cards)."""
    test_every_combination_clips_unscaled_gradients(precision, algorithm, accumulate, device="cuda")
