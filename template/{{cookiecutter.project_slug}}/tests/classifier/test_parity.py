"""The Trainer, as the CLI configures it, computes what the hand-written loop in benchmarks/reference_loop.py does:
the same per-step losses and the same final weights (fp32, deterministic, CPU)."""

import copy
import sys

import lightning as L
import pytest
import torch

from template_package.classifier.data import ImageDataModule
from template_package.classifier.model import ImageClassifier
from template_package.engine.data.loaders import resumable_loader

from helpers.classifier_task import CLASSIFIER
from helpers.cli import PROJECT_ROOT, cli, scalars

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
import reference_loop  # noqa: E402

# Digits give 19 training batches of 64: with accumulation 4 an epoch is 4 whole windows, its last 3 batches left out.
RECIPE = {"epochs": 3, "accumulate": 4, "lr": 3e-3, "weight_decay": 0.05, "warmup": 0.3, "clip_norm": 0.5}


def engine_train_loader(data: ImageDataModule):
    """The example's train loader as the engine's Trainer rebuilds it (engine/data/loaders.py): what it trains."""
    return resumable_loader(data.train_dataloader(), torch.initial_seed(), epoch=0)


def reference_run(precision: str, ema: dict | None = None, epochs: int = RECIPE["epochs"]):
    L.seed_everything(42)
    net = copy.deepcopy(
        ImageClassifier(num_classes=10, in_channels=1).net
    )  # the same initial weights the CLI's model gets with seed 42
    data = ImageDataModule()
    data.setup("fit")
    recipe = {**RECIPE, "epochs": epochs}
    losses = reference_loop.train(net, engine_train_loader(data), precision=precision, ema=ema, **recipe)
    return losses, net.state_dict()


def trainer_run(tmp_path, precision: str, *args: str, epochs: int = RECIPE["epochs"]) -> tuple[list[float], dict]:
    cli(
        "fit", f"--trainer.default_root_dir={tmp_path}", f"--trainer.precision={precision}",
        f"--trainer.max_epochs={epochs}", f"--trainer.accumulate_grad_batches={RECIPE['accumulate']}",
        f"--trainer.gradient_clip_val={RECIPE['clip_norm']}", f"--model.lr={RECIPE['lr']}",
        f"--model.weight_decay={RECIPE['weight_decay']}", f"--model.warmup={RECIPE['warmup']}",
        "--trainer.limit_val_batches=0", "--trainer.num_sanity_val_steps=0", "--trainer.log_every_n_steps=1",
        "--trainer.enable_progress_bar=false", *args, task=CLASSIFIER)  # fmt: skip
    losses = [value for _, value in scalars(tmp_path)["train/loss"]]
    return losses, torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)


def max_difference(saved: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    return max((saved[f"net.{k}"].double() - v.double()).abs().max().item() for k, v in reference.items())


# bf16 on a CPU without bf16 instructions is several times slower: 2 epochs (one epoch boundary) suffice for it.
@pytest.mark.parametrize(("precision", "epochs"), [("32-true", 3), ("bf16-mixed", 2)])
def test_trainer_matches_the_hand_written_loop(tmp_path, precision, epochs):
    ref_losses, ref_weights = reference_run(precision, epochs=epochs)
    losses, checkpoint = trainer_run(tmp_path, precision, epochs=epochs)
    assert len(losses) == len(ref_losses) == epochs * 4  # 19 // 4 = 4 optimizer steps per epoch
    assert losses == pytest.approx(ref_losses, abs=1e-6)
    assert max_difference(checkpoint["state_dict"], ref_weights) <= 1e-6


def test_the_ema_preset_matches_the_hand_written_loop_with_ema(tmp_path):
    """configs/ema.yaml: the checkpoint's state_dict is the moving average, what validate, test, predict and export
    load; it equals the hand-written loop's. (When training ends Lightning puts the average into the model too.)"""
    ema = {}
    ref_losses, ref_weights = reference_run("32-true", ema)
    losses, checkpoint = trainer_run(tmp_path, "32-true", "-c", str(PROJECT_ROOT / "configs" / "ema.yaml"))
    assert losses == pytest.approx(ref_losses, abs=1e-6)
    assert max_difference(checkpoint["state_dict"], ema) <= 1e-6
    weights = {k: v for k, v in ref_weights.items() if v.is_floating_point()}
    assert max_difference(checkpoint["state_dict"], weights) > 1e-3  # the average is not the trained weights


def test_reference_loop_really_clips_and_warms_up():
    """Guards the parity test: with these settings clipping is active and warmup ends mid-run."""
    total_steps = RECIPE["epochs"] * 5
    warmup_steps = round(RECIPE["warmup"] * total_steps)
    assert 0 < warmup_steps < total_steps
    L.seed_everything(42)
    model = ImageClassifier(num_classes=10, in_channels=1)
    data = ImageDataModule()
    data.setup("fit")
    images, targets = next(iter(engine_train_loader(data)))
    torch.nn.functional.cross_entropy(model(images), targets).backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    assert grad_norm > RECIPE["clip_norm"]


def test_logged_gradient_norms_and_clip_share_equal_the_hand_computed_ones(tmp_path):
    """train/grad_norm is the total gradient norm before clipping, train/clip_share the share of the optimizer steps
    since the previous log whose norm was above the clip value (0.5): both against norms computed by hand."""
    L.seed_everything(42)
    net = copy.deepcopy(ImageClassifier(num_classes=10, in_channels=1).net)
    data = ImageDataModule()
    data.setup("fit")
    norms = []
    reference_loop.train(net, engine_train_loader(data), precision="32-true", grad_norms=norms, **RECIPE)
    trainer_run(tmp_path, "32-true", "--trainer.log_every_n_steps=3")
    logged = scalars(tmp_path)
    assert [step for step, _ in logged["train/grad_norm"]] == [2, 5, 8, 11]  # of 12 optimizer steps
    for step, value in logged["train/grad_norm"]:
        assert value == pytest.approx(norms[step], rel=1e-5)
    for step, share in logged["train/clip_share"]:
        window = norms[step - 2 : step + 1]
        assert share == pytest.approx(sum(n > RECIPE["clip_norm"] for n in window) / 3)
    assert {share for _, share in logged["train/clip_share"]} != {0.0}  # clipping acted


def test_the_gradient_norm_command_prints_their_distribution(capsys):
    """python -m <package>.grad_norms: median, p90 and max of the unclipped norms of the run's first steps."""
    import statistics

    from template_package.engine.cli.grad_norms import main

    norms = main(["--steps", "12", "--trainer.max_epochs=1", *CLASSIFIER])
    out = capsys.readouterr().out
    assert len(norms) == 12 and all(n > 0 for n in norms)
    p90 = statistics.quantiles(norms, n=10, method="inclusive")[-1]
    assert f"median {statistics.median(norms):.4g}, p90 {p90:.4g}, max {max(norms):.4g}" in out
    assert f"--trainer.gradient_clip_val {p90:.2g}" in out
