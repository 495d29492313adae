"""The training recipe (engine/training/recipe.py), on any module: AdamW groups, per-step schedule, LR 0 impossible."""

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from template_package.engine.training.recipe import weight_decay_groups

from helpers.cli import QUICK, cli
from helpers.stand_in import StandInClassifier


def test_biases_and_norm_weights_do_not_decay():
    model = StandInClassifier(num_classes=10, in_channels=1)
    decay, no_decay = weight_decay_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("weight") and p.ndim >= 2 for p in decay["params"])
    assert {names[id(p)] for p in no_decay["params"]} >= {"net.8.bias", "net.1.weight"}  # head bias, BatchNorm scale
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


class RecordLR(L.Callback):
    """The LR each optimizer step is taken with."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])


@pytest.mark.parametrize("accumulate", [1, 3, 4])
@pytest.mark.parametrize(
    "max_epochs, max_steps", [(3, -1), (50, 5), (2, 1000)], ids=["epochs", "steps", "epochs_before_steps"]
)
def test_schedule_follows_the_formula_in_optimizer_steps(max_epochs, max_steps, accumulate):
    """10 batches per epoch: with accumulation 3 an epoch is ceil(10 / 3) = 4 optimizer steps (last window partial)."""
    data = TensorDataset(torch.rand(40, 1, 8, 8), torch.randint(0, 10, (40,)))
    peak, warmup, min_ratio = 1e-2, 0.25, 0.1
    model = StandInClassifier(num_classes=10, in_channels=1, lr=peak, warmup=warmup, min_lr_ratio=min_ratio)
    record = RecordLR()
    trainer = L.Trainer(
        max_epochs=max_epochs, max_steps=max_steps, accumulate_grad_batches=accumulate, callbacks=[record],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, DataLoader(data, batch_size=4))
    by_epochs = math.ceil(10 / accumulate) * max_epochs
    total = min(by_epochs, max_steps) if max_steps > 0 else by_epochs
    warmup_steps = round(warmup * total)
    assert trainer.global_step == len(record.lrs) == total
    assert model.lr_schedulers().total_steps == total
    assert record.lrs[0] == pytest.approx(peak / (warmup_steps + 1))
    assert record.lrs[warmup_steps] == pytest.approx(peak)
    rising, falling = record.lrs[: warmup_steps + 1], record.lrs[warmup_steps:]
    assert all(a < b for a, b in zip(rising[:-1], rising[1:], strict=True))
    assert all(a > b for a, b in zip(falling[:-1], falling[1:], strict=True))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(peak * min_ratio)  # after the last step


# --- Any WarmupCosineSchedule gets the run's length: LR 0 for a whole run is impossible ---------------------------


def test_a_plain_modules_own_warmup_cosine_gets_the_runs_length(run_dir):
    """A module that is not a TrainingRecipe uses the schedule in its own configure_optimizers: the engine's Trainer
    gives it the run's length (it trained at LR 0 for the whole run, exit 0, before)."""
    plain = ["--model=helpers.stand_in.PlainClassifier", "--model.lr=0.05", "--model.schedule=warmup_cosine"]
    result = cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, *plain,
                 "--trainer.callbacks+=test_recipe.RecordLR")  # fmt: skip
    record = next(c for c in result.trainer.callbacks if type(c).__name__ == "RecordLR")  # (imported by the CLI)
    assert result.model.lr_schedulers().total_steps == 12
    assert record.lrs[0] == pytest.approx(0.05 / 3) and max(record.lrs) == pytest.approx(0.05)


def test_a_warmup_cosine_stepped_per_epoch_is_refused_in_one_line(run_dir):
    with pytest.raises(SystemExit) as stop:
        cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--model=helpers.stand_in.PlainClassifier",
            "--model.schedule=warmup_cosine", "--model.interval=epoch")  # fmt: skip
    assert str(stop.value.code).startswith("error: WarmupCosineSchedule is stepped once per epoch: it counts optimizer")
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()


def test_a_warmup_cosine_stepped_without_a_length_raises():
    """In a plain Lightning Trainer and a plain module, nothing gives it a length: its first step raises, after one
    optimizer step at LR 0, instead of a whole run at LR 0."""
    from helpers.stand_in import PlainClassifier

    data = TensorDataset(torch.rand(40, 1, 8, 8), torch.randint(0, 10, (40,)))
    model = PlainClassifier(num_classes=10, in_channels=1, schedule="warmup_cosine")
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    with pytest.raises(RuntimeError, match="stepped before it knew the run's length: call set_total_steps"):
        trainer.fit(model, DataLoader(data, batch_size=4))
    assert trainer.global_step == 1


# --- The recipe's options: AdamW's betas and eps, the cosine's horizon ----------------------------------------------


@pytest.mark.parametrize(
    "flag, message",
    [("--model.betas=[0.9, 1.5]", "model.betas=[0.9, 1.5]: give AdamW two decay rates in [0, 1), e.g. [0.9, 0.999]"),
     ("--model.eps=-1", "model.eps=-1.0 is negative: give AdamW's epsilon >= 0, e.g. 1e-8"),
     ("--model.decay_steps=0", "decay_steps=0 is not a number of optimizer steps >= 1: raise model.decay_steps, or "
                               "set it to null (the run's length)"),
     ("--model.decay_steps=10", "warmup of 10 optimizer steps (warmup=10.0) is not shorter than decay_steps=10, where "
                                "the cosine ends: lower model.warmup or raise model.decay_steps")],
    ids=["betas", "eps", "decay_steps", "warmup"],
)  # fmt: skip
def test_a_bad_optimizer_setting_is_refused_in_one_line_before_training(run_dir, flag, message):
    with pytest.raises(SystemExit) as stop:
        cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--model.warmup=10", flag)
    assert stop.value.code == f"error: {message}"
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()


def test_a_horizon_of_its_own_needs_no_run_length_so_a_stream_trains_by_epochs(run_dir):
    """With model.decay_steps a loader without a length trains without trainer.max_steps (refused without it:
    test_loaders.py): 2 epochs of 20 batches, the last 10 steps at the floor."""
    result = cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--trainer.limit_train_batches=1.0",
                 "--data=helpers.stand_in.UnresumableStandInData", "--model.decay_steps=30")  # fmt: skip
    assert result.trainer.global_step == 40
    assert result.model.lr_schedulers().total_steps is None
    assert result.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.003 * 0.01, rel=1e-12)


# --- The recipe's metrics are written at the steps Lightning writes `self.log`'s ------------------------------------


class MemoryLogger(Logger):
    """Every write of the loggers: (step, the metrics' names)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[int, set[str]]] = []

    name, version = "memory", 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        self.writes.append((step, set(metrics)))


class SelfLogging(StandInClassifier):
    """The stand-in, logging a metric of its own at every step through `self.log`."""

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train/own", loss)
        return loss


class StopAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        trainer.should_stop = trainer.should_stop or trainer.global_step == self.step + 1


def test_the_recipe_writes_its_metrics_at_the_steps_lightning_writes_self_logs():
    """Every log_every_n_steps (here 4) and at the step a run stops (a callback's should_stop, here after step 5):
    train/loss where Lightning writes the module's own train/own (steps.logs_at); the recipe wrote none at the stop
    before. lr is read before the optimizer step: at a stop decided after it, train/loss is written alone."""
    data = TensorDataset(torch.rand(80, 1, 8, 8), torch.randint(0, 10, (80,)))
    logger = MemoryLogger()
    trainer = L.Trainer(
        max_epochs=1, log_every_n_steps=4, logger=logger, callbacks=[StopAt(5)], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(SelfLogging(num_classes=10, in_channels=1), DataLoader(data, batch_size=4))
    own = [step for step, names in logger.writes if "train/own" in names]
    losses = [step for step, names in logger.writes if "train/loss" in names]
    assert own == losses == [3, 5]
    assert [step for step, names in logger.writes if "lr" in names] == [3]
