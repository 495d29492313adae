"""The example task itself: its data (digits, an ImageFolder tree), its model, and the presets that use its own
options (channels_last, compile, on_device: configs/fast.yaml and configs/compile.yaml)."""

from pathlib import Path

import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits

from template_package.classifier.data import ImageDataModule, digits_splits
from template_package.classifier.model import ImageClassifier

from helpers.classifier_task import CLASSIFIER
from helpers.cli import PROJECT_ROOT, QUICK, cli, scalars


def test_loaders_shuffle_and_drop_last_only_for_training():
    dm = ImageDataModule(batch_size=100)
    dm.setup("fit")
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert type(train.sampler).__name__ == "RandomSampler" and train.drop_last  # the engine makes it resumable
    assert type(val.sampler).__name__ == "SequentialSampler" and not val.drop_last
    assert [len(y) for _, y in val] == [100, 100, 70]
    assert not train.pin_memory or torch.cuda.is_available()
    assert dm.num_workers == 0  # digits sit in memory: workers would only add IPC
    assert (dm.num_classes, dm.in_channels, dm.input_size) == (10, 1, 8)  # what the model takes from the data


@pytest.mark.parametrize("preset", ["fast.yaml", "compile.yaml"])
def test_the_presets_of_the_examples_own_options_parse(preset: str, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli("fit", "-c", str(PROJECT_ROOT / "configs" / preset), "--print_config", task=CLASSIFIER)
    assert exit_info.value.code in (0, None)
    assert "trainer:" in capsys.readouterr().out


def test_digits_split_is_disjoint_complete_and_fixed():
    train, val, test = digits_splits(0.15, 0.15, seed=0)
    assert (len(train), len(val), len(test)) == (1257, 270, 270)
    again = digits_splits(0.15, 0.15, seed=0)
    torch.testing.assert_close(val.tensors[0], again[1].tensors[0])
    # Together the three splits are exactly the 1,797 digits: compare them as multisets of images.
    images = torch.cat([train.tensors[0], val.tensors[0], test.tensors[0]]).flatten(1).double()
    original = torch.from_numpy(load_digits().data).double() / 16.0
    key = torch.rand(64, dtype=torch.float64)
    torch.testing.assert_close((images @ key).sort().values, (original @ key).sort().values)


def test_image_folder_tree_is_read_with_its_classes(tmp_path):
    for split in ("train", "val"):
        for label, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
            folder = tmp_path / split / label
            folder.mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (40, 30), color).save(folder / f"{i}.png")
    dm = ImageDataModule(data_dir=str(tmp_path), batch_size=2, num_workers=0, image_size=16)
    assert dm.classes == ["cat", "dog"] and dm.num_classes == 2 and dm.in_channels == 3
    dm.setup("fit")
    images, targets = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 3, 16, 16) and images.dtype == torch.float32
    val_images, val_targets = next(iter(dm.val_dataloader()))
    assert val_targets.tolist() == [0, 0]  # evaluation keeps file order
    assert val_images.shape == (2, 3, 16, 16)


def test_missing_train_folder_names_the_path(tmp_path):
    with pytest.raises(ValueError, match="has no train/ folder"):
        ImageDataModule(data_dir=str(tmp_path))


def test_predict_step_returns_class_probabilities():
    model = ImageClassifier(num_classes=10, in_channels=1).eval()
    probs = model.predict_step((torch.rand(5, 1, 8, 8), torch.zeros(5)), 0)
    assert probs.shape == (5, 10)
    torch.testing.assert_close(probs.sum(-1), torch.ones(5))


@pytest.mark.slow
def test_compiled_model_checkpoint_loads_into_an_uncompiled_model(run_dir: Path):
    from template_package.classifier.model import ImageClassifier

    cli("fit", "-c", str(PROJECT_ROOT / "configs" / "compile.yaml"), f"--trainer.default_root_dir={run_dir}",
        "--trainer.max_steps=3", "--trainer.limit_val_batches=2", "--trainer.enable_progress_bar=false",
            task=CLASSIFIER)  # fmt: skip
    weights = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    plain = ImageClassifier(num_classes=10, in_channels=1)
    assert set(weights) == set(plain.state_dict())  # no "_orig_mod." prefixes
    plain.load_state_dict(weights)


def test_channels_last_trains_like_the_default_layout_and_its_checkpoint_loads_without_it(tmp_path: Path):
    """The memory layout changes how convolutions are computed, not what: same losses (to float rounding)."""
    runs = {layout: tmp_path / layout for layout in ("default", "channels_last")}
    for layout, run_dir in runs.items():
        cli("fit", f"--trainer.default_root_dir={run_dir}", f"--model.channels_last={layout == 'channels_last'}",
            "--trainer.log_every_n_steps=1", *QUICK, task=CLASSIFIER)  # fmt: skip
    losses = {layout: [value for _, value in scalars(run_dir)["train/loss"]] for layout, run_dir in runs.items()}
    assert len(losses["default"]) == 12
    torch.testing.assert_close(losses["channels_last"], losses["default"], rtol=1e-4, atol=1e-5)
    checkpoint = runs["channels_last"] / "checkpoints" / "last.ckpt"
    conv = torch.load(checkpoint, weights_only=True)["state_dict"]["net.features.3.weight"]
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    validate = cli("validate", f"--trainer.default_root_dir={runs['channels_last']}", f"--ckpt_path={checkpoint}",
                   "--model.channels_last=false", task=CLASSIFIER)  # fmt: skip
    fit_val_acc = scalars(runs["channels_last"])["val/acc"][-1][1]
    assert float(validate.trainer.callback_metrics["val/acc"]) == pytest.approx(fit_val_acc)  # the same weights
