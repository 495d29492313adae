"""The product's promise: `python -m template_package fit` with no options trains digits to >= 98% accuracy."""

import re

from classifier_task import CLASSIFIER
from conftest import cli_subprocess, scalars


def test_default_fit_reaches_98_percent_and_test_uses_last_ckpt(tmp_path):
    run_dir = tmp_path / "run"
    fit = cli_subprocess(
        "fit", f"--trainer.default_root_dir={run_dir}", "--trainer.enable_progress_bar=false", task=CLASSIFIER
    )
    assert fit.returncode == 0, fit.stderr[-2000:]
    best_val_acc = max(value for _, value in scalars(run_dir)["val/acc"])
    assert best_val_acc >= 0.98
    test = cli_subprocess(
        "test",
        f"--trainer.default_root_dir={run_dir}",
        f"--ckpt_path={run_dir}/checkpoints/last.ckpt",
        task=CLASSIFIER,
    )
    assert test.returncode == 0, test.stderr[-2000:]
    test_acc = float(re.search(r"test/acc\s*[│|]?\s*([0-9.]+)", test.stdout).group(1))
    assert test_acc >= 0.97
