"""Lightning's own callbacks that change training, each in a run SIGKILLed after the callback has acted and resumed:
bit-identical to the run that never stopped (weights, optimizer and schedule states, generators, every logged
value, the callbacks' own series such as LearningRateMonitor's included)."""

import hashlib

import pytest
import torch
import yaml

from helpers.runs import assert_same_run, freeze_config, kill_when_frozen, reference_run, resume_fit, start_fit

pytestmark = pytest.mark.slow
CALLBACKS = "lightning.pytorch.callbacks"
# 4 epochs of 6 batches; killed at step 16 (after each callback below has acted), last.ckpt then at step 15.
CASES = {
    "EarlyStopping": {"monitor": "val/acc", "mode": "max", "patience": 2, "min_delta": 0.5},  # (ends at step 18)
    "LearningRateMonitor": {"logging_interval": "step"},
    "Timer": {},
    "GradientAccumulationScheduler": {"scheduling": {0: 1, 2: 2}},
}


def task(folder, name: str, init_args: dict) -> list[str]:
    if name == "Timer":  # (as users set it: Lightning's own Timer, from trainer.max_time)
        return ["--trainer.max_epochs=4", "--trainer.limit_train_batches=6", "--trainer.max_time=00:01:00:00"]
    text = yaml.safe_dump({"trainer": {"callbacks+": [{"class_path": f"{CALLBACKS}.{name}", "init_args": init_args}]}})
    config = folder / f"callbacks-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    config.write_text(text)
    return ["--trainer.max_epochs=4", "--trainer.limit_train_batches=6", "-c", str(config)]


@pytest.mark.parametrize("name", CASES)
def test_a_run_with_lightnings_callback_killed_after_it_acted_resumes_bit_identical(tmp_path, tmp_path_factory, name):
    args = task(tmp_path_factory.getbasetemp(), name, CASES[name])
    reference = reference_run(tmp_path_factory, args)
    run_dir = tmp_path / "run"
    process = start_fit(run_dir, "-c", freeze_config(tmp_path, hook="on_train_batch_end", step=16), *args)
    kill_when_frozen(process, tmp_path / "frozen")
    killed = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert killed["global_step"] == 15
    resume_fit(run_dir, *args)
    assert_same_run(reference, run_dir)
    final = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    if name == "Timer":  # the elapsed time restored and counted on (the resumed run is shorter than the killed one)
        timer = next(key for key in final["callbacks"] if key.startswith("Timer"))
        elapsed = [c["callbacks"][timer]["time_elapsed"]["train"] for c in (killed, final)]
        assert elapsed[1] > elapsed[0] > 0, elapsed
    if name == "EarlyStopping":  # (it stopped the run: both at the same step)
        assert final["global_step"] == 18
    if name == "GradientAccumulationScheduler":  # 2 epochs of 6 steps, 2 of 3; the schedule's length is theirs
        assert final["global_step"] == final["lr_schedulers"][0]["total_steps"] == 18


SWA = {"swa_lrs": 1e-3, "swa_epoch_start": 2}


def test_swa_resumed_from_an_epoch_end_after_its_start_is_bit_identical(tmp_path, tmp_path_factory):
    """StochasticWeightAveraging from epoch 2: it swaps the recipe's schedule for SWALR and averages the weights at
    each epoch's start. Killed at the first step of epoch 3 (last.ckpt: epoch 2's end) and resumed."""
    args = task(tmp_path_factory.getbasetemp(), "StochasticWeightAveraging", SWA)
    args += ["--last_checkpoint.every_n_steps=0"]
    reference = reference_run(tmp_path_factory, args)
    run_dir = tmp_path / "run"
    process = start_fit(run_dir, "-c", freeze_config(tmp_path, hook="on_train_batch_end", step=19), *args)
    kill_when_frozen(process, tmp_path / "frozen")
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 18
    resume_fit(run_dir, *args)
    assert_same_run(reference, run_dir)


def test_swa_resumed_mid_epoch_after_its_start_stops_in_one_line(tmp_path, tmp_path_factory):
    """Lightning's SWA restores its average and SWALR in on_train_epoch_start, which a run resumed mid-epoch skips:
    the resumed run would train on the recipe's schedule with no average. The engine's check stops it first."""
    args = task(tmp_path_factory.getbasetemp(), "StochasticWeightAveraging", SWA)
    assert refused_on_resume(tmp_path, args).startswith(
        "error: callback StochasticWeightAveraging's state n_averaged is 0 in the resumed run and 2 in the checkpoint"
    )


def test_model_pruning_resumed_stops_in_one_line_naming_the_parameter(tmp_path, tmp_path_factory):
    """ModelPruning reparametrizes each weight (weight_orig and a mask) and saves the pruned weights without the masks:
    a resumed model trains other parameters. The engine's check refuses it before the first step."""
    args = task(tmp_path_factory.getbasetemp(), "ModelPruning", {"pruning_fn": "l1_unstructured", "amount": 0.2})
    assert refused_on_resume(tmp_path, args).startswith(
        "error: the resumed run does not train the parameters the checkpoint did: optimizer 0's param group 0 holds "
        "'net.0.weight' where the checkpoint's held 'net.0.weight_orig'"
    )


def refused_on_resume(tmp_path, args: list[str]) -> str:
    """Kill a run with `args` at step 16, resume it, and return the one line that stopped the resumed run."""
    run_dir = tmp_path / "run"
    process = start_fit(run_dir, "-c", freeze_config(tmp_path, hook="on_train_batch_end", step=16), *args)
    kill_when_frozen(process, tmp_path / "frozen")
    with pytest.raises(SystemExit) as stop:
        resume_fit(run_dir, *args)
    assert "\n" not in str(stop.value.code)
    return str(stop.value.code)
