"""What a run optimises (engine/training/monitor.py): BestCheckpoints runs Lightning's check at each training batch only
where a batch can save, and saving by steps still saves at those steps; EarlyStopping says when it stopped a run."""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from template_package.engine.training.monitor import BestCheckpoints, EarlyStopping

from helpers.cli import QUICK, cli, extra_config


class LogsItsLoss(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", 1.0)  # never improves

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("every_n_train_steps", [None, 2])
def test_the_check_at_each_batch_runs_only_when_saving_by_steps(tmp_path, monkeypatch, every_n_train_steps):
    checks = []
    lightnings_check = ModelCheckpoint.on_train_batch_end
    monkeypatch.setattr(
        ModelCheckpoint, "on_train_batch_end", lambda self, *args: checks.append(1) or lightnings_check(self, *args)
    )
    steps = {"every_n_train_steps": every_n_train_steps}
    best = BestCheckpoints(dirpath=tmp_path, filename="{step}", monitor="train_loss", save_top_k=-1, **steps)
    trainer = L.Trainer(
        max_epochs=1, callbacks=[best], logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    data = TensorDataset(torch.rand(24, 4))
    trainer.fit(LogsItsLoss(), DataLoader(data, batch_size=4))  # 6 batches
    saved = sorted(int(path.stem.split("step=")[1].split("-")[0]) for path in tmp_path.glob("*.ckpt"))
    if every_n_train_steps:
        assert len(checks) == 6 and saved == [2, 4, 6]
    else:
        assert checks == [] and saved == [6]  # (the epoch's end)


def test_early_stopping_says_that_it_stopped_the_run(tmp_path, capsys):
    stopper = EarlyStopping(monitor="val_loss", mode="min", patience=1)
    trainer = L.Trainer(
        max_epochs=10, callbacks=[stopper], logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=tmp_path,
    )  # fmt: skip
    data = DataLoader(TensorDataset(torch.rand(8, 4)), batch_size=4)
    trainer.fit(LogsItsLoss(), data, data)
    assert trainer.current_epoch == 2  # (epoch 0 set the best; epoch 1 did not improve on it: stop)
    notice = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notice: stopped early")]
    assert notice == [
        "notice: stopped early at epoch 1: Monitored metric val_loss did not improve in the last 1 records. Best "
        "score: 1.000. Signaling Trainer to stop."
    ]


def test_a_model_checkpoint_of_the_users_leaves_the_runs_best_checkpoints_in_charge(tmp_path):
    """The run's monitor (`--checkpoint.*`) decides `trainer.checkpoint_callback`, which `ckpt_path="best"`, the end of
    run's summary and the sweeps read, whatever ModelCheckpoint the config adds before it."""
    theirs = {"monitor": "val/loss", "dirpath": str(tmp_path / "theirs"), "filename": "{epoch}", "save_top_k": -1}
    config = extra_config(tmp_path / "theirs.yaml", callbacks=[{"class_path": f"{ModelCheckpoint.__module__}."
                                                                f"ModelCheckpoint", "init_args": theirs}])  # fmt: skip
    trainer = cli("fit", f"--trainer.default_root_dir={tmp_path / 'run'}", *QUICK, "-c", config).trainer
    assert isinstance(trainer.checkpoint_callback, BestCheckpoints) and trainer.checkpoint_callback.monitor == "val/acc"
    assert sorted(path.name for path in (tmp_path / "theirs").glob("*.ckpt")) == ["epoch=0.ckpt", "epoch=1.ckpt"]
