"""The Trainer, as the CLI configures it, computes what the hand-written loop in benchmarks/reference_loop.py does:
the same per-step losses and the same final weights (fp32, deterministic, CPU)."""

import copy
import sys

import lightning as L
import pytest
import torch
from conftest import PROJECT_ROOT, cli, scalars

from template_package.data import ImageDataModule
from template_package.model import ImageClassifier

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import reference_loop  # noqa: E402

# Digits give 19 training batches of 64: with accumulation 4 every epoch ends in a partial window of 3 batches.
RECIPE = {"epochs": 3, "accumulate": 4, "lr": 3e-3, "weight_decay": 0.05, "warmup": 0.3, "clip_norm": 0.5}


def reference_run(precision: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    L.seed_everything(42)
    net = copy.deepcopy(ImageClassifier().net)  # the same initial weights the CLI's model gets with seed 42
    data = ImageDataModule()
    data.setup("fit")
    losses = reference_loop.train(net, data.train_dataloader(), precision=precision, **RECIPE)
    return losses, net.state_dict()


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_trainer_matches_the_hand_written_loop(tmp_path, precision):
    ref_losses, ref_weights = reference_run(precision)
    cli(
        "fit", f"--trainer.default_root_dir={tmp_path}", f"--trainer.precision={precision}",
        f"--trainer.max_epochs={RECIPE['epochs']}", f"--trainer.accumulate_grad_batches={RECIPE['accumulate']}",
        f"--trainer.gradient_clip_val={RECIPE['clip_norm']}", f"--model.lr={RECIPE['lr']}",
        f"--model.weight_decay={RECIPE['weight_decay']}", f"--model.warmup={RECIPE['warmup']}",
        "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false",
    )  # fmt: skip
    losses = [value for _, value in scalars(tmp_path)["train/loss"]]
    assert len(losses) == len(ref_losses) == 3 * 5  # ceil(19 / 4) = 5 optimizer steps per epoch
    assert losses == pytest.approx(ref_losses, abs=1e-6)
    weights = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    max_diff = max((weights[f"net.{k}"].float() - v.float()).abs().max().item() for k, v in ref_weights.items())
    assert max_diff <= 1e-6


def test_reference_loop_really_clips_and_warms_up():
    """Guards the parity test: with these settings clipping is active and warmup ends mid-run."""
    total_steps = RECIPE["epochs"] * 5
    warmup_steps = round(RECIPE["warmup"] * total_steps)
    assert 0 < warmup_steps < total_steps
    L.seed_everything(42)
    model = ImageClassifier()
    data = ImageDataModule()
    data.setup("fit")
    images, targets = next(iter(data.train_dataloader()))
    torch.nn.functional.cross_entropy(model(images), targets).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    assert grad_norm > RECIPE["clip_norm"]
