"""model.py, nets.py and schedulers.py copied into another package train with a bare Trainer, without the CLI."""

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
    for module in ("model.py", "nets.py", "schedulers.py"):
        shutil.copy(f"{source}/{module}", package / module)
    monkeypatch.syspath_prepend(str(tmp_path / "their_code"))
    model_module = importlib.import_module("vision.model")
    assert "template_package" not in sys.modules.get("vision.model").__dict__.get("__package__", "")

    L.seed_everything(0)
    train, val, _ = digits_splits(0.15, 0.15, seed=0)
    model = model_module.ImageClassifier(lr=3e-3)
    trainer = L.Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, DataLoader(train, batch_size=64, shuffle=True, drop_last=True), DataLoader(val, batch_size=256))
    assert type(model.net).__module__ == "vision.nets"
    assert trainer.callback_metrics["val/acc"] >= 0.95
    assert torch.isfinite(trainer.callback_metrics["val/loss"])
