"""The command line and its run-directory contract, run for real on digits."""

from pathlib import Path

import pytest
import torch
from conftest import PROJECT_ROOT, QUICK, cli, cli_subprocess, scalars


def test_fit_writes_the_run_directory_contract(run_dir: Path):
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert "max_epochs: 2" in (run_dir / "config.yaml").read_text()
    logged = scalars(run_dir)
    assert {"train/loss", "val/loss", "val/acc", "lr"} <= logged.keys()
    assert [step for step, _ in logged["val/acc"]] == [5, 11]  # one value per epoch, at the epoch's last step
    assert [step for step, _ in logged["train/loss"]] == [step for step, _ in logged["lr"]] == [9]  # every 10 steps
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 12 and ckpt["epoch"] == 1
    assert len(list((run_dir / "checkpoints").glob("epoch=*-val_acc=*.ckpt"))) == 2  # top-k by val/acc


def test_validate_test_predict_load_the_checkpoint(run_dir: Path):
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    ckpt = str(run_dir / "checkpoints" / "last.ckpt")
    config_before = (run_dir / "config.yaml").read_text()
    for subcommand in ("validate", "test", "predict"):
        cli(subcommand, f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={ckpt}")
    assert "test/acc" in scalars(run_dir)
    assert (run_dir / "config.yaml").read_text() == config_before  # only fit writes the run's config


def test_resume_continues_the_same_run(run_dir: Path):
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    cli("fit", f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last", *QUICK[1:], "--trainer.max_epochs=3")
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 18
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("last*")) == ["last.ckpt"]
    assert [step for step, _ in scalars(run_dir)["val/acc"]] == [5, 11, 17]  # one TensorBoard run, no gap
    assert not list(run_dir.glob("version_*"))


def test_ckpt_path_last_without_a_checkpoint_starts_fresh(run_dir: Path, capsys):
    cli("fit", f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last", *QUICK)
    assert "starting a fresh run" in capsys.readouterr().out
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_fresh_fit_refuses_to_overwrite_an_existing_run(run_dir: Path):
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    last = run_dir / "checkpoints" / "last.ckpt"
    before = last.read_bytes()
    result = cli_subprocess("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    assert result.returncode != 0
    assert f"{run_dir} already holds a run" in result.stderr and "--ckpt_path last" in result.stderr
    assert last.read_bytes() == before


def test_print_config_shows_the_resolved_defaults():
    result = cli_subprocess("fit", "--print_config")
    assert result.returncode == 0, result.stderr
    for line in ("precision: auto", "gradient_clip_val: 1.0", "deterministic: true", "seed_everything: 42"):
        assert line in result.stdout


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
    from lightning.pytorch.callbacks import EarlyStopping, RichProgressBar

    result = cli(
        "fit", "-c", str(PROJECT_ROOT / "configs" / "early_stopping.yaml"), f"--trainer.default_root_dir={run_dir}"
    )
    callbacks = result.trainer.callbacks
    stopper = next(c for c in callbacks if isinstance(c, EarlyStopping))
    assert stopper.monitor == "val/acc" and stopper.patience == 5
    assert any(isinstance(c, RichProgressBar) for c in callbacks)  # added to the list, not replacing it
    assert result.trainer.current_epoch < 20  # digits saturate early: it stopped before max_epochs
