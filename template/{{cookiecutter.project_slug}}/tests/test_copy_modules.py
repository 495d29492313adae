"""Modules copied into another package work with a bare Trainer, without the CLI: model.py with nets.py and
schedulers.py; resume.py with durable.py and stop_signals.py."""

import importlib
import shutil
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader

import template_package
from template_package.data import digits_splits


def test_copied_modules_train_with_a_bare_trainer(tmp_path, monkeypatch):
    package = tmp_path / "their_code" / "vision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    source = template_package.__path__[0]
    for module in ("model.py", "nets.py", "schedulers.py", "errors.py", "durable.py"):
        shutil.copy(f"{source}/{module}", package / module)
    monkeypatch.syspath_prepend(str(tmp_path / "their_code"))
    model_module = importlib.import_module("vision.model")
    assert "template_package" not in sys.modules.get("vision.model").__dict__.get("__package__", "")

    L.seed_everything(0)
    train, val, _ = digits_splits(0.15, 0.15, seed=0)
    model = model_module.ImageClassifier(num_classes=10, in_channels=1, lr=3e-3)
    trainer = L.Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, DataLoader(train, batch_size=64, shuffle=True, drop_last=True), DataLoader(val, batch_size=256))
    assert type(model.net).__module__ == "vision.nets"
    assert trainer.callback_metrics["val/acc"] >= 0.95
    assert torch.isfinite(trainer.callback_metrics["val/loss"])


def test_copied_resume_modules_keep_last_ckpt_with_a_bare_trainer(tmp_path, monkeypatch):
    """resume.py with its siblings durable.py and stop_signals.py: last.ckpt written atomically by a plain Trainer."""
    package = tmp_path / "their_code" / "training"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    source = template_package.__path__[0]
    for module in ("resume.py", "durable.py", "stop_signals.py", "model.py", "nets.py", "schedulers.py", "errors.py"):
        shutil.copy(f"{source}/{module}", package / module)
    monkeypatch.syspath_prepend(str(tmp_path / "their_code"))
    resume = importlib.import_module("training.resume")
    model_module = importlib.import_module("training.model")

    L.seed_everything(0)
    train, _, _ = digits_splits(0.15, 0.15, seed=0)
    callbacks = [resume.LastCheckpoint(str(tmp_path / "ckpt"), every_n_steps=5), resume.ResumableRNGState()]
    trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        callbacks=callbacks, limit_train_batches=6)  # fmt: skip
    trainer.fit(
        model_module.ImageClassifier(num_classes=10, in_channels=1),
        DataLoader(train, batch_size=64, shuffle=True, drop_last=True),
    )
    checkpoint = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 12 and "rng_states" in checkpoint
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["last.ckpt"]
