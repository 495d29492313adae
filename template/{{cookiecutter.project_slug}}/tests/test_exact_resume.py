"""ExactResume in a Trainer of the user's own (helpers/plain_trainer.py: a plain `lightning.Trainer` and a plain
LightningModule whose torchmetrics and loss are logged with on_epoch=True): killed or stopped mid-epoch and resumed with
`ckpt_path="last"`, it ends with the uninterrupted run's weights, optimizer state and every logged value, step and
epoch rows; one fit a folder; `ckpt_path="last"` on an empty folder starts with a notice, and a fit without one over a
run is refused; `ckpt_path="best"` names the user's ModelCheckpoint's best whatever the callbacks' order."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from template_package.engine import ExactResume
from template_package.engine.errors import UsageError
from template_package.engine.resume.digests import damage
from template_package.engine.resume.whole_checkpoint import saved_step

from helpers.cli import started, subprocess_env
from helpers.plain_trainer import BATCHES, MetricsModule, PlainData, logged
from helpers.plain_trainer import main as plain_fit
from helpers.runs import assert_same_state, kill_when_frozen, wait_until_frozen

COMPARED = ("state_dict", "optimizer_states", "global_step", "epoch", "rng_states", "epoch_state")


def start_script(run_dir: Path, *args: str, callbacks: list = ()) -> subprocess.Popen:
    command = [sys.executable, "-m", "helpers.plain_trainer", str(run_dir), *args]
    if callbacks:
        command += ["--callbacks", json.dumps(list(callbacks))]
    return started(subprocess.Popen(command, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True))  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    run_dir.mkdir()
    plain_fit([str(run_dir)])
    return run_dir


def assert_same_as(reference: Path, run_dir: Path) -> None:
    ref = torch.load(reference / "checkpoints" / "last.ckpt", weights_only=True)
    got = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    for key in COMPARED:
        assert_same_state(ref[key], got[key], key)
    expected, found = logged(reference), logged(run_dir)
    assert found == expected, sorted(set(found.items()) ^ set(expected.items()))[:6]
    assert {name for name, _ in expected} >= {"train/acc", "train/mean_loss", "train/loss_epoch", "val/acc_best"}


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM"])
def test_a_plain_trainer_stopped_mid_epoch_resumes_to_the_same_bits_and_epoch_values(tmp_path, uninterrupted, stop):
    """Stopped in the second epoch's seventh batch (step 18, last.ckpt at step 15): the resumed epoch's logged
    torchmetrics and on_epoch means must sum the batches before the stop too."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if stop == "SIGKILL":
        freeze = ["helpers.kill_points.FreezeAt", {"marker": str(tmp_path / "frozen"), "hook": "on_train_batch_end",
                                                   "step": BATCHES + 6, "flush_logs": True}]  # fmt: skip
        kill_when_frozen(start_script(run_dir, callbacks=[freeze]), tmp_path / "frozen")
    else:
        signal_at = ["helpers.faults.SignalAt", {"hook": "on_train_batch_end", "step": BATCHES + 6}]
        process = start_script(run_dir, callbacks=[signal_at])
        _, err = process.communicate(timeout=300)
        assert process.returncode == 143, err[-3000:]
        assert "stopped by SIGTERM" in err
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert BATCHES < saved["global_step"] < 2 * BATCHES  # (inside the second epoch)
    plain_fit([str(run_dir), "--ckpt_path=last"])
    assert_same_as(uninterrupted, run_dir)


@pytest.mark.slow
def test_a_plain_trainer_stopped_in_the_validation_after_an_epochs_last_batch_logs_that_epochs_values(
    tmp_path, uninterrupted
):
    """SIGTERM in the second epoch's validation, after its last batch: the resumed run trains no batch of that epoch
    before its end, and still logs the epoch's torchmetrics and on_epoch means, as the uninterrupted run did (red
    without ExactResume registering them again: train/acc, train/mean_loss and train/loss_epoch missing at step 23)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    signal_at = ["helpers.faults.SignalAt", {"hook": "validation", "step": 2 * BATCHES}]
    process = start_script(run_dir, callbacks=[signal_at])
    _, err = process.communicate(timeout=300)
    assert process.returncode == 143, err[-3000:]
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 2 * BATCHES and saved["epoch"] == 1  # (inside the second epoch, at its end)
    plain_fit([str(run_dir), "--ckpt_path=last"])
    assert_same_as(uninterrupted, run_dir)


@pytest.mark.slow
def test_one_fit_a_folder_and_last_starts_an_empty_one_and_a_fit_without_it_over_a_run_is_refused(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    freeze = [
        "helpers.kill_points.FreezeAt",
        {"marker": str(tmp_path / "frozen"), "hook": "on_train_batch_end", "step": 6},
    ]  # fmt: skip (last.ckpt holds step 5)
    first = start_script(run_dir, callbacks=[freeze])
    wait_until_frozen(first, tmp_path / "frozen")
    with pytest.raises(UsageError, match=rf"^{run_dir} is being trained by another fit \(host \S+ pid {first.pid}\)"):
        plain_fit([str(run_dir), "--ckpt_path=last"])
    kill_when_frozen(first, tmp_path / "frozen")
    with pytest.raises(UsageError) as refused:
        plain_fit([str(run_dir)])
    assert str(refused.value) == (
        f"{run_dir / 'checkpoints'} already holds a run ({run_dir / 'checkpoints' / 'last.ckpt'}): resume it with "
        'fit(ckpt_path="last"), or give the Trainer another default_root_dir, or ExactResume another dirpath'
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    plain_fit([str(empty), "--ckpt_path=last"])
    assert f'fit(ckpt_path="last"): no {empty / "checkpoints" / "last.ckpt"} yet, starting a fresh run' in (
        capsys.readouterr().out
    )
    assert torch.load(empty / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 3 * BATCHES


def test_a_plain_trainers_damaged_last_ckpt_goes_on_from_previous_ckpt(tmp_path, uninterrupted, capsys):
    """fit(ckpt_path="last") in a Trainer of the user's own: last.ckpt (step 36) with a byte changed, previous.ckpt
    (step 35) intact: one notice, and the run ends as the uninterrupted one, every logged value included."""
    run_dir = Path(shutil.copytree(uninterrupted, tmp_path / "run"))
    last, previous = run_dir / "checkpoints" / "last.ckpt", run_dir / "checkpoints" / "previous.ckpt"
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0x04
    last.write_bytes(data)
    why = damage(last)
    plain_fit([str(run_dir), "--ckpt_path=last"])
    notice = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notice: ")]
    assert notice == [f"notice: {last} (step 36) is damaged: {why}: resuming from {previous}, the state before it "
                      "(step 35)"]  # fmt: skip
    assert_same_as(uninterrupted, run_dir)


@pytest.mark.parametrize("first", [True, False], ids=["listed_first", "listed_last"])
def test_ckpt_path_best_names_the_users_model_checkpoint_whatever_the_order(tmp_path, first):
    best = ModelCheckpoint(dirpath=tmp_path / "best", monitor="val/acc", mode="max")
    exact = ExactResume(tmp_path / "run" / "checkpoints")
    trainer = L.Trainer(max_epochs=1, callbacks=[exact, best] if first else [best, exact], logger=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_train_batches=3)  # fmt: skip
    trainer.fit(MetricsModule(), PlainData())
    assert trainer.checkpoint_callback is best and best.best_model_path
    results = trainer.validate(MetricsModule(), PlainData(), ckpt_path="best", verbose=False)
    assert results[0]["val/acc"] == pytest.approx(best.best_model_score.item())


def test_a_second_last_ckpt_writer_is_refused_naming_its_setting(tmp_path):
    callbacks = [ExactResume(), ModelCheckpoint(tmp_path / "checkpoints", save_last=True)]
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, default_root_dir=tmp_path,
                        callbacks=callbacks)  # fmt: skip
    with pytest.raises(UsageError, match=r"ModelCheckpoint\(save_last=True\) writes a last.ckpt of its own beside "
                       r"ExactResume's .*: set its save_last to False"):  # fmt: skip
        trainer.fit(MetricsModule(), PlainData())
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("part", ["metrics", "sums"])
def test_without_the_epoch_state_the_resumed_epoch_logs_other_values(tmp_path, uninterrupted, monkeypatch, part):
    """The negative control: the torchmetrics states (or Lightning's on_epoch sums) not put back, the weights are still
    exact but the resumed epoch's logged values are not."""
    from template_package.engine.resume import epoch_state

    if part == "metrics":
        monkeypatch.setattr(epoch_state, "put_back", lambda module, saved: None)
    else:
        monkeypatch.setattr(epoch_state, "add_to_epoch_sums", lambda trainer, saved: list(saved))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    freeze = ["helpers.kill_points.FreezeAt", {"marker": str(tmp_path / "frozen"), "hook": "on_train_batch_end",
                                               "step": BATCHES + 6, "flush_logs": True}]  # fmt: skip
    kill_when_frozen(start_script(run_dir, callbacks=[freeze]), tmp_path / "frozen")
    plain_fit([str(run_dir), "--ckpt_path=last"])
    ref = torch.load(uninterrupted / "checkpoints" / "last.ckpt", weights_only=True)
    assert_same_state(ref["state_dict"], torch.load(run_dir / "checkpoints" / "last.ckpt")["state_dict"])
    differ = {name for (name, step), value in logged(run_dir).items() if logged(uninterrupted)[name, step] != value}
    assert differ == ({"train/acc", "train/mean_loss"} if part == "metrics" else {"train/loss_epoch"})


class ListConfigured(MetricsModule):
    """Hyperparameters as Hydra gives them: an OmegaConf ListConfig."""

    def __init__(self, widths=None) -> None:
        super().__init__()
        self.save_hyperparameters()


class ModuleConfigured(MetricsModule):
    """A network built by the config and given whole, kept in the hyperparameters (lightning-hydra-template's net)."""

    def __init__(self, net: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()


class PathState(L.Callback):
    """A callback whose state holds an object weights-only loading refuses."""

    def state_dict(self) -> dict:
        return {"folder": Path("somewhere")}


def short_fit(module: L.LightningModule, tmp_path: Path, *callbacks, epochs: int = 1, **fit) -> L.Trainer:
    trainer = L.Trainer(max_epochs=epochs, limit_train_batches=3, limit_val_batches=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[ExactResume(every_n_steps=2), *callbacks])  # fmt: skip
    trainer.fit(module, PlainData(), **fit)
    return trainer


def test_hyperparameters_from_hydra_are_stored_plain_and_the_checkpoint_loads_weights_only(tmp_path):
    OmegaConf = pytest.importorskip("omegaconf", reason="hydra-core is not installed: pip install hydra-core").OmegaConf

    short_fit(ListConfigured(OmegaConf.create({"widths": [32, 16]}).widths), tmp_path)
    widths = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["hyper_parameters"]["widths"]
    assert widths == [32, 16] and type(widths) is list
    assert short_fit(ListConfigured([32, 16]), tmp_path, epochs=2, ckpt_path="last").global_step == 6


def test_a_hyperparameter_or_a_state_that_would_not_load_stops_the_run_before_it_trains(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(8, 4))
    with pytest.raises(UsageError) as stop:
        short_fit(ModuleConfigured(net), tmp_path / "module")
    assert str(stop.value) == (
        "ModuleConfigured's hyperparameters net (a Sequential) would not load from its checkpoints (a resume loads "
        "them with weights_only=True, which takes numbers, strings, lists and dicts): leave them out with "
        "self.save_hyperparameters(ignore=['net']) and keep them as attributes (self.net = net, read where "
        "self.hparams.net was), the config building them again, or give plain values"
    )
    assert not (tmp_path / "module" / "checkpoints").exists()
    with pytest.raises(UsageError, match=r"last.ckpt would not load back .*: callbacks holds pathlib.PosixPath; make "
                       r"the state_dict of what saves it return plain values"):  # fmt: skip
        short_fit(MetricsModule(), tmp_path / "state", PathState())
    assert not (tmp_path / "state" / "checkpoints" / "last.ckpt").exists()


@pytest.mark.slow
def test_ddp_spawn_stopped_by_sigterm_exits_143_and_resumes_to_the_uninterrupted_runs_bits(tmp_path):
    """The engine's Trainer under ddp_spawn (2 CPU processes, the Trainer pickled to each): SIGTERM on rank 0 stops
    every rank at the same step, the launching process exits 143 (not Lightning's exception) with the line naming
    last.ckpt's step, and the run resumed with ckpt_path="last" ends as the one that never stopped."""
    spawn = ["--engine_trainer", "--strategy=ddp_spawn", "--devices=2"]
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    for folder in (reference, run_dir):
        folder.mkdir()
    # (The uninterrupted run's processes forked, not spawned: the same two ranks' arithmetic, without importing torch
    # in each again.)
    uninterrupted = start_script(reference, "--engine_trainer", "--strategy=ddp_fork", "--devices=2")
    assert uninterrupted.wait(timeout=600) == 0, uninterrupted.communicate()[1][-3000:]
    signal_at = ["helpers.faults.SignalAt", {"hook": "on_train_batch_end", "step": BATCHES + 3}]
    stopped = start_script(run_dir, *spawn, callbacks=[signal_at])
    _, err = stopped.communicate(timeout=600)
    assert stopped.returncode == 143, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = run_dir / "checkpoints" / "last.ckpt"  # (the launching process says the line its stopped ranks would)
    assert err.strip().splitlines()[-1] == f"stopped by SIGTERM: {last} holds step {saved_step(last)}", err[-3000:]
    resumed = start_script(run_dir, *spawn, "--ckpt_path=last")
    assert resumed.wait(timeout=600) == 0, resumed.communicate()[1][-3000:]
    assert_same_as(reference, run_dir)


@pytest.mark.slow
def test_a_run_never_seeded_resumes_reading_the_order_its_seed_gave(tmp_path):
    """No seed_everything: torch's initial seed is a new one in each process, and the train loader's order follows it.
    A resumed process reads on with the seed its checkpoint records, and ends as an uninterrupted run from that seed
    (red with the seed taken from the resumed process instead)."""
    run_dir, reference = tmp_path / "run", tmp_path / "reference"
    for folder in (run_dir, reference):
        folder.mkdir()
    freeze = ["helpers.kill_points.FreezeAt", {"marker": str(tmp_path / "frozen"), "hook": "on_train_batch_end",
                                               "step": BATCHES + 6, "flush_logs": True}]  # fmt: skip
    kill_when_frozen(start_script(run_dir, "--seed=none", callbacks=[freeze]), tmp_path / "frozen")
    seed = int((run_dir / "seed.txt").read_text())
    plain_fit([str(run_dir), "--ckpt_path=last", "--seed=none"])
    plain_fit([str(reference), f"--seed=torch:{seed}"])
    assert_same_as(reference, run_dir)
