"""The product's promise: `python -m template_package fit` with no options trains digits to >= 98% accuracy."""

from helpers.classifier_task import CLASSIFIER
from helpers.cli import cli, cli_subprocess, scalars


def test_default_fit_reaches_98_percent_and_test_uses_last_ckpt(tmp_path):
    run_dir = tmp_path / "run"
    fit = cli_subprocess(
        "fit", f"--trainer.default_root_dir={run_dir}", "--trainer.enable_progress_bar=false", task=CLASSIFIER
    )
    assert fit.returncode == 0, fit.stderr[-2000:]
    best_val_acc = max(value for _, value in scalars(run_dir)["val/acc"])
    assert best_val_acc >= 0.98
    test = cli(
        "test", f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={run_dir}/checkpoints/last.ckpt", task=CLASSIFIER
    )  # (in this process: the command that matters above ran as the user runs it)
    assert test.trainer.callback_metrics["test/acc"].item() >= 0.97
