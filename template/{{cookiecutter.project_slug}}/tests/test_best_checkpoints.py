"""The best checkpoints (engine/training/monitor.py, BestCheckpoints): Lightning's check at each training batch runs
only where a batch can save, and saving by steps still saves at those steps."""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from template_package.engine.training.monitor import BestCheckpoints


class LogsItsLoss(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train_loss", loss)
        return loss

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
