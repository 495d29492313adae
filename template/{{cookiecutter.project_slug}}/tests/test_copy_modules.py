"""The engine copied whole into another package works there, with the example's model beside it, without the CLI:
a bare Trainer trains the model, and resume.py keeps last.ckpt."""

import importlib
import shutil

import lightning as L
import torch
from torch.utils.data import DataLoader

import template_package
from template_package.classifier.data import digits_splits


def copy_into_a_new_package(tmp_path, monkeypatch, name: str):
    """`engine/` and `classifier/` copied into the package `name` of another project, importable from there."""
    package = tmp_path / "their_code" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    source = template_package.__path__[0]
    for folder in ("engine", "classifier"):
        shutil.copytree(f"{source}/{folder}", package / folder, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path / "their_code"))
    return importlib.import_module(f"{name}.classifier.model"), importlib.import_module(f"{name}.engine.resume")


def test_copied_modules_train_with_a_bare_trainer(tmp_path, monkeypatch):
    model_module, _ = copy_into_a_new_package(tmp_path, monkeypatch, "vision")
    L.seed_everything(0)
    train, val, _ = digits_splits(0.15, 0.15, seed=0)
    model = model_module.ImageClassifier(num_classes=10, in_channels=1, lr=3e-3)
    trainer = L.Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, DataLoader(train, batch_size=64, shuffle=True, drop_last=True), DataLoader(val, batch_size=256))
    assert type(model.net).__module__ == "vision.classifier.nets"
    assert trainer.callback_metrics["val/acc"] >= 0.95
    assert torch.isfinite(trainer.callback_metrics["val/loss"])


def test_copied_resume_modules_keep_last_ckpt_with_a_bare_trainer(tmp_path, monkeypatch):
    """resume.py with its siblings: last.ckpt written atomically by a plain Trainer."""
    model_module, resume = copy_into_a_new_package(tmp_path, monkeypatch, "training")
    L.seed_everything(0)
    train, _, _ = digits_splits(0.15, 0.15, seed=0)
    callbacks = [resume.LastCheckpoint(str(tmp_path / "ckpt"), every_n_steps=5), resume.ResumableRNGState()]
    trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        callbacks=callbacks, limit_train_batches=6)  # fmt: skip
    model = model_module.ImageClassifier(num_classes=10, in_channels=1)
    trainer.fit(model, DataLoader(train, batch_size=64, shuffle=True, drop_last=True))
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 12 and "rng_states" in checkpoint
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["last.ckpt"]
