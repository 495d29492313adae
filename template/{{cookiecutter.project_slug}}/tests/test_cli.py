"""The command line and its run-directory contract, run for real on the stand-in task."""

import csv
from pathlib import Path

import pytest
import torch
import yaml

from helpers.cli import PROJECT_ROOT, QUICK, cli, cli_subprocess, resume, scalars
from helpers.runs import log_steps_against_last_ckpt


def test_fit_writes_the_run_directory_contract(run_dir: Path, tmp_path: Path):
    # The callbacks and logging cadence configs/default.yaml ships with, whatever yours are now.
    shipped = {"trainer": {"log_every_n_steps": 10, "callbacks": [
        {"class_path": f"template_package.engine.report.{name}"} for name in
        ("progress.TimedProgressBar", "confusion.ConfusionMatrixImage", "throughput.Throughput")]}}  # fmt: skip
    (tmp_path / "shipped.yaml").write_text(yaml.safe_dump(shipped))
    cli(
        "fit",
        f"--trainer.default_root_dir={run_dir}",
        *QUICK,
        "-c",
        str(tmp_path / "shipped.yaml"),
        "--checkpoint.save_top_k=2",
    )
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert "max_epochs: 2" in (run_dir / "config.yaml").read_text()
    logged = scalars(run_dir)
    assert {"train/loss", "val/loss", "val/acc", "lr", "perf/samples_per_sec", "perf/data_wait_share",
            "perf/epoch_seconds", "train/grad_norm", "train/clip_share"} <= logged.keys()  # fmt: skip
    assert [step for step, _ in logged["perf/epoch_seconds"]] == [5, 11]
    assert all(0 < seconds < 60 for _, seconds in logged["perf/epoch_seconds"])
    assert all(0 < share < 1 for _, share in logged["perf/data_wait_share"])
    assert all(rate > 0 for _, rate in logged["perf/samples_per_sec"])
    assert [step for step, _ in logged["val/acc"]] == [5, 11]  # one value per epoch, at the epoch's last step
    assert [step for step, _ in logged["train/loss"]] == [step for step, _ in logged["lr"]] == [9]  # every 10 steps
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 12 and ckpt["epoch"] == 2  # written when training ended, after 2 whole epochs
    assert_confusion_image_matches_the_model(run_dir, ckpt)
    assert len(list((run_dir / "checkpoints").glob("epoch=*-val_acc=*.ckpt"))) == 2  # top-k by val/acc


def test_validate_test_predict_load_the_checkpoint(run_dir: Path):
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    ckpt = str(run_dir / "checkpoints" / "last.ckpt")
    config_before = (run_dir / "config.yaml").read_text()
    for subcommand in ("validate", "test", "predict"):
        cli(subcommand, f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={ckpt}")
    assert "test/acc" in scalars(run_dir)
    assert (run_dir / "config.yaml").read_text() == config_before  # only fit writes the run's config
    rows = list(csv.DictReader((run_dir / "predictions.csv").open()))
    assert len(rows) == 270 and [int(r["index"]) for r in rows] == list(range(270))  # the test split
    probs = [float(rows[0][f"p_{c}"]) for c in range(10)]
    assert sum(probs) == pytest.approx(1.0, abs=1e-4) and rows[0]["prediction"] == str(probs.index(max(probs)))


def test_resume_continues_the_same_run(run_dir: Path):
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    resume(run_dir, *QUICK[1:], "--trainer.max_epochs=3")
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 18
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("last*")) == ["last.ckpt", "last.ckpt.crc32"]
    assert [step for step, _ in scalars(run_dir)["val/acc"]] == [5, 11, 17]  # one TensorBoard run, no gap
    assert not list(run_dir.glob("version_*"))


def test_last_ckpt_appears_only_after_every_earlier_step_is_logged(run_dir: Path, monkeypatch):
    """Whenever last.ckpt holds step S, steps 0..S-1 are already in TensorBoard: a resumed run logs from S on, so an
    earlier step missing then would be missing for good. (Lightning logs a step after on_train_batch_end, where the
    checkpoint is taken; it is written at the next hook.)"""
    seen = log_steps_against_last_ckpt(run_dir, monkeypatch)
    assert len(seen) >= 12 and max(saved for _, saved in seen) >= 10
    assert all(step >= saved for step, saved in seen), seen


@pytest.mark.parametrize(
    "every_n_steps, extra, writes",
    [(5, [], [5, 10, 12]), (6, [], [6, 12]), (0, [], [6, 12]), (4, ["--trainer.max_steps=9"], [4, 8, 9])],
    ids=["every5", "due-on-last-batches", "epoch-ends", "max_steps"],
)
def test_last_ckpt_is_written_when_due_and_when_training_ends(run_dir: Path, monkeypatch, every_n_steps, extra, writes):
    """QUICK has 6-batch epochs: a write due on an epoch's last batch (steps 6, 12) is made at the epoch end; the final
    state is written however training ends, and not twice."""
    from template_package.engine.resume.durable import DurableCheckpointIO

    written, save = [], DurableCheckpointIO.save_checkpoint

    def recording_save(self, checkpoint, path, **kwargs):
        if Path(path).name == "last.ckpt":
            written.append(checkpoint["global_step"])
        save(self, checkpoint, path, **kwargs)

    monkeypatch.setattr(DurableCheckpointIO, "save_checkpoint", recording_save)
    every = f"--last_checkpoint.every_n_steps={every_n_steps}"
    cli("fit", f"--trainer.default_root_dir={run_dir}", every, *QUICK, *extra)
    assert written == writes
    final = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["global_step"] == writes[-1]
    if not extra:  # the state when training ended, whatever the cadence: its last epoch counted as done
        assert final["epoch"] == 2 and final["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 2


def test_checkpoint_snapshot_is_a_copy_that_training_cannot_change():
    """last.ckpt is written in the background from this snapshot while training goes on changing the weights."""
    from template_package.engine.resume.durable import snapshot

    weights, progress = torch.ones(3), [1]
    state, copied = snapshot({"state_dict": {"w": weights}, "loops": {"done": progress}})
    weights.add_(1)
    progress.append(2)
    assert copied is None  # nothing to wait for without CUDA tensors
    assert torch.equal(state["state_dict"]["w"], torch.ones(3)) and state["loops"]["done"] == [1]


def test_ckpt_path_last_without_a_checkpoint_starts_fresh(run_dir: Path, capsys):
    cli("fit", f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last", *QUICK)
    assert "starting a fresh run" in capsys.readouterr().out
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_fresh_fit_refuses_to_overwrite_an_existing_run_and_a_smoke_run_leaves_it_as_it_was(run_dir: Path):
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    files = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file() and path.name != ".lock"}
    with pytest.raises(SystemExit) as stop:
        cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    assert f"{run_dir} already holds a run" in str(stop.value.code) and "--ckpt_path last" in str(stop.value.code)
    cli("fit", f"--trainer.default_root_dir={run_dir}", "--trainer.fast_dev_run=true", *QUICK)
    after = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file() and path.name != ".lock"}
    assert after == files and any(path.name == "last.ckpt" for path in files)


def test_print_config_shows_the_resolved_defaults(capsys):
    with pytest.raises(SystemExit) as stop:
        cli("fit", "--print_config")
    assert stop.value.code in (None, 0)
    printed = capsys.readouterr().out
    for line in ("precision: auto", "gradient_clip_val: 1.0", "deterministic: true", "seed_everything: 42"):
        assert line in printed


def test_every_moved_class_is_found_and_an_old_path_trains_with_the_new_class_and_one_warning(tmp_path, capsys):
    from importlib import import_module

    from template_package.engine import ExactResume
    from template_package.engine.cli.old_class_paths import MOVED

    pytest.importorskip("optuna", reason='some moved classes are the sweep\'s: pip install -e ".[sweep]"')
    for new in MOVED.values():
        module, name = new.rsplit(".", 1)
        assert isinstance(getattr(import_module(f"template_package.engine.{module}"), name), type), new
    old = "template_package.engine.resume.rng.ResumableRNGState"  # (merged into TrainedState, then ExactResume)
    trainer = cli("fit", *QUICK, f"--trainer.default_root_dir={tmp_path}", f"--trainer.callbacks+={old}").trainer
    assert sum(isinstance(callback, ExactResume) for callback in trainer.callbacks) == 1
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert warnings == [f"warning: the command line names {old}, which moved to template_package.engine.resume."
                        "exact_resume.ExactResume: read as the new one; update it (CHANGELOG.md)"]  # fmt: skip


def test_a_config_naming_a_moved_class_is_read_through_a_copy_that_is_gone_when_the_command_ends(tmp_path, monkeypatch):
    config, temporary = tmp_path / "old.yaml", tmp_path / "tmp"
    config.write_text("trainer:\n  callbacks+:\n    - class_path: template_package.engine.callbacks.Throughput\n")
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))  # (the command's temporary files, where the test can count them)
    result = cli_subprocess("fit", "-c", str(config), "--print_config")
    assert result.returncode == 0, result.stderr
    assert "class_path: template_package.engine.report.throughput.Throughput" in result.stdout
    assert f"warning: {config} names template_package.engine.callbacks.Throughput" in result.stderr
    assert list(temporary.iterdir()) == []


def printed_config(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as stop:
        cli("fit", *args, "--print_config", task=[])
    assert stop.value.code in (None, 0)
    return yaml.safe_load(capsys.readouterr().out)


def test_a_class_switched_on_the_command_line_starts_from_its_own_defaults(capsys, tmp_path: Path):
    """jsonargparse carries the previous class's values over for arguments of the same name (the first config's
    dropout 0.1 and batch_size 64); the engine starts the new class from its own (0.3 and 16), and a value given
    after the switch applies."""
    first = tmp_path / "first.yaml"
    first.write_text(yaml.safe_dump({
        "model": {"class_path": "helpers.stand_in.StandInClassifier", "init_args": {"dropout": 0.1}},
        "data": {"class_path": "helpers.stand_in.StandInData", "init_args": {"batch_size": 64}},
    }))  # fmt: skip
    switched = printed_config(capsys, "-c", str(first), "--model", "helpers.stand_in.OwnDefaultsClassifier",
                              "--data=helpers.stand_in.OwnDefaultsData")  # fmt: skip
    assert switched["model"]["init_args"]["dropout"] == 0.3 and switched["data"]["init_args"]["batch_size"] == 16
    given = printed_config(
        capsys, "-c", str(first), "--model=helpers.stand_in.OwnDefaultsClassifier", "--model.dropout=0.2"
    )
    assert given["model"]["init_args"]["dropout"] == 0.2
    kept = printed_config(capsys, "-c", str(first), "--model=helpers.stand_in.StandInClassifier", "--data.batch_size=8")
    assert kept["model"]["init_args"]["dropout"] == 0.1 and kept["data"]["init_args"]["batch_size"] == 8
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump({"model": {"class_path": "helpers.stand_in.OwnDefaultsClassifier"}}))
    assert printed_config(capsys, "-c", str(first), "-c", str(second))["model"]["init_args"]["dropout"] == 0.3


@pytest.mark.parametrize("preset", ["bf16.yaml", "fp16.yaml"])
def test_mixed_precision_presets_train_on_cpu(run_dir: Path, preset: str):
    """On CPU Lightning runs both as bf16 autocast (16-mixed becomes bf16-mixed); the GPU paths run in test_gpu.py."""
    cli(
        "fit",
        "-c",
        str(PROJECT_ROOT / "configs" / preset),
        f"--trainer.default_root_dir={run_dir}",
        "--trainer.log_every_n_steps=1",
        *QUICK,
    )
    losses = [value for _, value in scalars(run_dir)["train/loss"]]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]


def test_early_stopping_preset_adds_to_the_default_callbacks(run_dir: Path):
    from lightning.pytorch.callbacks import EarlyStopping, TQDMProgressBar

    result = cli(
        "fit", "-c", str(PROJECT_ROOT / "configs" / "early_stopping.yaml"), f"--trainer.default_root_dir={run_dir}"
    )
    callbacks = result.trainer.callbacks
    stopper = next(c for c in callbacks if isinstance(c, EarlyStopping))
    assert stopper.monitor == "val/acc" and stopper.patience == 5
    assert any(isinstance(c, TQDMProgressBar) for c in callbacks)  # added to the list, not replacing it
    assert result.trainer.current_epoch < 20  # the stand-in saturates early: it stopped before max_epochs
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == result.trainer.global_step  # the final state, written when training ended


def assert_confusion_image_matches_the_model(run_dir: Path, checkpoint: dict) -> None:
    """The last image equals the row-normalised confusion matrix of the validated model, computed by hand."""
    from helpers.stand_in import StandInClassifier, synthetic_images

    model = StandInClassifier(num_classes=10, in_channels=1).eval()
    model.load_state_dict(checkpoint["state_dict"])
    images, targets = synthetic_images()["val"].tensors
    with torch.no_grad():
        predicted = model(images).argmax(-1)
    counts = torch.bincount(targets * 10 + predicted, minlength=100).reshape(10, 10).float()
    expected = counts / counts.sum(1, keepdim=True)
    image = torch.from_numpy(confusion_matrix_image(run_dir).copy()).float() / 255
    assert image.shape == (160, 160)  # 10 classes x 16 pixels
    torch.testing.assert_close(image[8::16, 8::16], expected, atol=1 / 255, rtol=0)


def confusion_matrix_image(run_dir: Path):
    """The last confusion-matrix image TensorBoard holds, as a 2-D uint8 array."""
    import io

    import numpy as np
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    events.Reload()
    encoded = events.Images("val/confusion_matrix")[-1].encoded_image_string
    return np.asarray(Image.open(io.BytesIO(encoded)).convert("L"))


@pytest.mark.parametrize("preset", ["fsdp.yaml", "ddp.yaml", "mlflow.yaml", "csv.yaml", "ema.yaml", "bf16.yaml"])
def test_every_preset_parses(preset: str, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli("fit", "-c", str(PROJECT_ROOT / "configs" / preset), "--print_config")
    assert exit_info.value.code in (0, None)
    assert "trainer:" in capsys.readouterr().out


def test_progress_bar_redraws_by_time_and_shows_each_epochs_count(run_dir: Path, tmp_path: Path, monkeypatch):
    """TimedProgressBar with a 1-hour period: 3 quick epochs draw the training bar only after each validation and
    at the end (Lightning's bar: ~4 draws an epoch, plus one every 10 batches), each time with the count of the
    batches trained, not the count it had when last drawn. (The period is given as an option: a default patched in
    the signature did not reach a bar built from a parser cached by an earlier test, whose 1-s period redrew a slow
    epoch under load.)"""
    from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

    bar = {"class_path": "template_package.engine.report.progress.TimedProgressBar",
           "init_args": {"refresh_seconds": 3600.0, "leave": False}}  # fmt: skip
    (tmp_path / "bar.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": [bar]}}))
    drawn, display = [], Tqdm.display

    def recording_display(self, *args, **kwargs):
        if self.desc.startswith("Epoch"):
            drawn.append((self.desc, self.n, self.total))
        return display(self, *args, **kwargs)

    monkeypatch.setattr(Tqdm, "display", recording_display)
    monkeypatch.setattr(Tqdm, "monitor_interval", 0)  # (tqdm's monitor thread redraws a bar idle for 10 s: under load)
    cli("fit", f"--trainer.default_root_dir={run_dir}", "--trainer.max_epochs=3", "--trainer.limit_train_batches=6",
        "-c", str(tmp_path / "bar.yaml"))  # fmt: skip
    assert [desc for desc, _, _ in drawn] == ["Epoch 0: ", "Epoch 1: ", "Epoch 2: ", "Epoch 2: "]  # validations, end
    assert all(n == total == 6 for _, n, total in drawn), drawn


@pytest.mark.slow
def test_evaluating_a_runs_checkpoint_writes_into_that_run_at_its_step(run_dir: Path, tmp_path: Path):
    """Without --trainer.default_root_dir, validate and predict of DIR/checkpoints/X.ckpt log and write
    predictions.csv into DIR, not into the default run directory (the working directory's runs/default); validate's
    metrics land at the checkpoint's step, beside the run's last validation, not at step 0."""
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    cli("validate", f"--ckpt_path={checkpoint}")
    cli("predict", f"--ckpt_path={checkpoint}")
    assert (run_dir / "predictions.csv").is_file() and len(list(run_dir.glob("events.out.tfevents.*"))) == 3
    assert not (tmp_path / "runs").exists()
    assert [step for step, _ in scalars(run_dir)["val/acc"]] == [5, 11, 11]  # the fit's two validations, then this


def test_predictions_of_a_regression_are_values_not_class_probabilities(tmp_path: Path):
    from types import SimpleNamespace

    from template_package.engine.report.predictions import PredictionsCSV

    trainer = SimpleNamespace(predict_dataloaders=SimpleNamespace(dataset=[]), datamodule=None)
    writer = PredictionsCSV(str(tmp_path / "regression.csv"))
    writer.write_on_epoch_end(trainer, None, [torch.tensor([[0.5, -1.0], [2.0, 0.25]])], [[[0, 1]]])
    assert (tmp_path / "regression.csv").read_text().splitlines() == ["index,y_0,y_1", "0,0.5,-1.0", "1,2.0,0.25"]
    writer = PredictionsCSV(str(tmp_path / "classes.csv"))
    writer.write_on_epoch_end(trainer, None, [torch.tensor([[0.25, 0.75]])], [[[0]]])
    assert (tmp_path / "classes.csv").read_text().splitlines() == ["index,prediction,p_0,p_1", "0,1,0.250000,0.750000"]


def test_a_command_that_starts_with_its_subcommand_builds_that_parser_only(tmp_path, capsys):
    """Each subcommand's parser reads the signatures of every class it can build: a `fit` builds fit's alone, and
    --help (no subcommand first) still lists them all."""
    from template_package.engine.cli.main import TOOLS, build_cli
    from template_package.engine.internals import subcommands_action

    built = build_cli(["fit", f"--trainer.default_root_dir={tmp_path}", *QUICK], run_subcommand=False)
    assert set(subcommands_action(built.parser).choices) == {"fit", *TOOLS}
    with pytest.raises(SystemExit):
        build_cli(["--help"])
    assert "{fit,validate,test,predict,sweep," in capsys.readouterr().out
