"""Every training pattern keeps every guarantee, for modules written the way Lightning's documentation writes them
(patterns.py): manual optimization with two optimizers and schedules stepped at epoch ends, state a module changes in
its own epoch-end and validation-end hooks, no `train/loss`, Lightning's own demo classes, a module with nothing to
monitor. A checkpoint taken at an epoch's end, or at a signal in a validation, resumes bit for bit."""

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from helpers.cli import PROJECT_ROOT, QUICK, cli, extra_config
from helpers.runs import (
    KILL_POINTS,
    assert_kill_and_resume_exact,
    assert_same_run,
    reference_run,
    resume_fit,
    start_fit,
    wait_until_frozen,
)

# The task's classes after the stand-in's (helpers.cli.STAND_IN), which the helpers of test_resume.py put first.
GAN = ["--model=null", "--model=helpers.patterns.ManualGAN", "--checkpoint.monitor=null"]
HOOKS = ["--model=null", "--model=helpers.patterns.EpochHooksClassifier"]
EMA = ["-c", str(PROJECT_ROOT / "configs" / "ema.yaml")]
METRICS = ["--model=null", "--model=helpers.patterns.EpochMetricsClassifier"]
BATCHES = 19  # the stand-in's batches an epoch
TASKS = {"manual_gan": (GAN, 2), "epoch_hooks": (HOOKS, 1)}  # (options, optimizer steps a batch)


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_a_run_killed_after_an_epoch_end_checkpoint_resumes_what_the_epoch_end_changed(
    tmp_path, tmp_path_factory, task
):
    """last.ckpt written at epoch ends only; SIGKILLed in the first batch of the second epoch, so that the resumed
    run starts from the epoch-end state: the module's own on_train_epoch_end (the GAN's two schedules, the
    classifier's halved learning rate) must be in it, and not run a second time."""
    options, steps_a_batch = TASKS[task]
    args = [*options, "--last_checkpoint.every_n_steps=0"]
    run_dir = assert_kill_and_resume_exact(tmp_path, tmp_path_factory, args, hook="on_train_batch_end",
                                           step=BATCHES * steps_a_batch + 1, batch_idx=0)  # fmt: skip
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["training_steps"] == 3 * BATCHES  # the logged x-axis: batches, whatever the optimizers
    if task == "manual_gan":
        assert [s["last_epoch"] for s in checkpoint["lr_schedulers"]] == [3, 3]
        assert checkpoint["state_dict"]["validations"] == 4  # the sanity check's and one an epoch


@pytest.mark.slow
@pytest.mark.parametrize("kill_point", ["mid_second_epoch", "during_validation"])
def test_torchmetrics_and_sums_logged_on_epoch_resume_to_the_epochs_values(tmp_path, tmp_path_factory, kill_point):
    """Lightning's most common logging pattern (EpochMetricsClassifier) on the command line, SIGKILLed mid-epoch or in
    a validation and resumed: its epoch values (train/acc, train/mean_loss, train/epoch_loss, val/acc_best) are the
    uninterrupted run's, as are its weights."""
    assert_kill_and_resume_exact(tmp_path, tmp_path_factory, METRICS, **KILL_POINTS[kill_point])


@pytest.mark.slow
@pytest.mark.parametrize("task", ["manual_gan", "ema"])
def test_a_signal_in_a_slow_validation_stops_within_a_batch_and_the_resumed_run_validates_again(
    tmp_path, tmp_path_factory, task
):
    """Validation batches of 3 s (15 s for the 5 batches): SIGTERM during the second batch of epoch 0's validation
    exits 143 within one more batch, with the training state as validation found it; the resumed run validates again
    from the first batch (the GAN changes state at validation ends, EMA swaps the averaged weights in for validation)
    and ends like the run that never stopped."""
    args = GAN if task == "manual_gan" else EMA
    step = BATCHES * (2 if task == "manual_gan" else 1)
    reference = reference_run(tmp_path_factory, args)
    run_dir, marker = tmp_path / "run", tmp_path / "frozen"
    frozen = {
        "class_path": "helpers.kill_points.FreezeAt",
        "init_args": {
            "marker": str(marker),
            "hook": "on_validation_batch_end",
            "step": step,
            "batch_idx": 1,
            "until_signal": True,
        },
    }
    slow = {"class_path": "helpers.patterns.SlowValidation", "init_args": {"seconds": 3.0}}  # fmt: skip
    process = start_fit(run_dir, "-c", extra_config(tmp_path / "slow.yaml", callbacks=[frozen, slow]), *args)
    wait_until_frozen(process, marker)
    sent = time.monotonic()
    os.killpg(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 143, err[-3000:]
    assert time.monotonic() - sent < 7, "it waited for the validation to end"
    assert err.strip().splitlines()[-1] == f"stopped by SIGTERM: {run_dir / 'checkpoints' / 'last.ckpt'} holds step 19"
    resume_fit(run_dir, *args)
    assert_same_run(reference, run_dir)


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_what_the_module_changes_after_each_batch(tmp_path, tmp_path_factory):
    """The average of the weights, updated in the module's on_train_batch_end, which Lightning calls after every
    callback's: the step's state is taken after it."""
    args = ["--model=null", "--model=helpers.patterns.AveragingClassifier"]
    assert_kill_and_resume_exact(tmp_path, tmp_path_factory, args, hook="on_train_batch_end", step=8)


@pytest.mark.slow
def test_sigkill_during_validation_resumes_the_module_that_changes_state_at_validation_ends(tmp_path, tmp_path_factory):
    """Killed in epoch 1's validation: the resumed run replays from the last checkpoint, validation included."""
    assert_kill_and_resume_exact(tmp_path, tmp_path_factory, [*GAN, "--last_checkpoint.every_n_steps=10"],
                                 hook="on_validation_batch_end", step=2 * 2 * BATCHES, batch_idx=2)  # fmt: skip


def fit_gan(run_dir: Path, *args: str):
    return cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, *GAN, *args)


def test_manual_optimization_trains_with_the_default_clipping_which_it_applies_itself(tmp_path, capsys):
    """The default config clips at 1.0, which Lightning refuses for manual optimization: the GAN trains anyway;
    without a clip_gradients call of its own it is told once that the clipping is not applied, and with one, the
    configured value is the one applied."""
    fit_gan(tmp_path / "plain")
    err = capsys.readouterr().err
    assert err.count("notice: ManualGAN optimizes manually and its first training batch clipped no gradients") == 1
    assert "self.clip_gradients(optimizer, self.trainer.gradient_clip_val" in err

    moved = {}
    for clip in ("1e-9", "1e9"):  # nearly nothing passes, or everything
        run_dir = tmp_path / f"clip{clip}"
        fit_gan(run_dir, "--model.clip=true", f"--trainer.gradient_clip_val={clip}")
        assert "optimizes manually" not in capsys.readouterr().err
        weights = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        moved[clip] = weights["generator.0.weight"]
    # Adam's step size does not depend on the gradient's scale, but clipped to ~0 the moments stay ~0 for long.
    assert not torch.equal(moved["1e-9"], moved["1e9"])


def test_lightnings_own_demo_classes_train_with_nothing_to_monitor_and_evaluate_from_their_checkpoint(run_dir, capsys):
    """BoringModel and BoringDataModule take no arguments and log nothing to monitor: --checkpoint.monitor null means
    last.ckpt only, said once; validate, test and predict then build the same classes from the command line."""
    boring = ["--model=lightning.pytorch.demos.boring_classes.BoringModel",
              "--data=lightning.pytorch.demos.boring_classes.BoringDataModule"]  # fmt: skip
    task = ["--model=null", "--data=null", *boring]
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--checkpoint.monitor=null", task=task)
    err = capsys.readouterr().err
    assert err.count("notice: checkpoint.monitor is null: no best checkpoints, only") == 1
    assert sorted(path.name for path in (run_dir / "checkpoints").iterdir()) == ["last.ckpt", "last.ckpt.crc32"]
    last = run_dir / "checkpoints" / "last.ckpt"
    for command in ("validate", "test", "predict"):
        cli(command, f"--ckpt_path={last}", task=task)
    cli("validate", "-c", str(run_dir / "config.yaml"), f"--ckpt_path={last}", task=[])


def test_a_monitored_metric_never_logged_stops_fit_at_the_first_validation_on_a_line_of_its_own(tmp_path):
    """BoringModel logs nothing in validation; the GAN logs val/d_real only: both stop after the sanity check (or,
    without one, the first validation), before any checkpoint, naming what they log."""
    boring = ["--model=null", "--data=null", "--model=lightning.pytorch.demos.boring_classes.BoringModel",
              "--data=lightning.pytorch.demos.boring_classes.BoringDataModule"]  # fmt: skip
    for name, task, extra, logged in (
        ("boring", boring, [], "logs nothing in validation"),
        ("gan", GAN[:2], ["--trainer.num_sanity_val_steps=0"], "which logs val/d_real in validation"),
    ):
        run_dir = tmp_path / name
        with pytest.raises(SystemExit) as stop:
            cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--checkpoint.monitor=val/f1", *extra,
                task=[*([] if task is boring else ["--data=null", "--data=helpers.stand_in.StandInData"]),
                      *task])  # fmt: skip
        assert str(stop.value.code).startswith("error: checkpoint.monitor='val/f1' is not logged by")
        assert logged in str(stop.value.code)
        assert not (run_dir / "checkpoints" / "last.ckpt").exists()
