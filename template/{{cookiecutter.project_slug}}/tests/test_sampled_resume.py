"""Exact resume with the samplers real teams use (tests/helpers/sampled_data.py): a WeightedRandomSampler rebalancing an
imbalanced set and a length-bucketing batch sampler of one's own, SIGKILLed mid-epoch after a last.ckpt and right
after an epoch-end one, on 1 and 2 processes, end bit-identical to the run that never stopped, with no notice; a
sampler whose order is not a function of the seed and the epoch gets one notice when it resumes."""

import pytest
import torch

from template_package.engine.resume.durable import DurableCheckpointIO

from helpers.cli import QUICK, STAND_IN, cli, resume
from helpers.runs import (
    BASE,
    DDP,
    KILL_POINTS,
    assert_kill_and_resume_exact,
    freeze_config,
    kill_when_frozen,
    reference_run,
    run_killed_and_resumed,
    start_fit,
)

pytestmark = pytest.mark.slow
SAMPLED = {
    "weighted": ["--data=helpers.sampled_data.WeightedData"],
    "bucketing": ["--data=helpers.sampled_data.BucketedData"],
    "batch_reads": ["--data=helpers.sampled_data.BatchReadData"],
}


@pytest.mark.parametrize("kill_point", ["mid_epoch", "epoch_end"])
@pytest.mark.parametrize("data", ["weighted", "bucketing", "batch_reads"])
def test_a_users_sampler_killed_and_resumed_ends_bit_identical(tmp_path, tmp_path_factory, capsys, data, kill_point):
    assert_kill_and_resume_exact(tmp_path, tmp_path_factory, SAMPLED[data], **KILL_POINTS[kill_point])
    assert "notice" not in capsys.readouterr().err


def test_a_weighted_sampler_on_two_processes_resumes_bit_identical(tmp_path, tmp_path_factory):
    assert_kill_and_resume_exact(tmp_path, tmp_path_factory, [*SAMPLED["weighted"], *DDP, "--data.num_workers=2"],
                                 hook="on_train_batch_end", step=6)  # fmt: skip


def test_a_sampler_whose_order_does_not_repeat_gets_one_notice_on_resume(tmp_path, capsys):
    run_killed_and_resumed(
        tmp_path, tmp_path / "run", ["--data=helpers.sampled_data.SystemRandomData"], **KILL_POINTS["mid_epoch"]
    )
    err = capsys.readouterr().err
    assert err.count("notice:") == 1, err
    assert "notice: the train loader's SystemRandomSampler drew another order for epoch 0 than the run that was " in err


# Without BatchNorm, whose batch statistics are per device: 2 processes and 1 then differ only in float summation order.
NO_BATCH_NORM = ["--model.batch_norm=false", "--trainer.max_epochs=2"]


def test_a_weighted_sampler_moved_from_two_processes_to_one_goes_on_with_the_same_samples(tmp_path, tmp_path_factory):
    """The drawn order is one of global positions, as the engine's own shuffle: a run killed on 2 processes and
    resumed on 1 (`--allow_change world_size`) ends as the 2-process run that never stopped, up to float rounding."""
    args = [*SAMPLED["weighted"], *NO_BATCH_NORM]
    reference = torch.load(reference_run(tmp_path_factory, [*args, *DDP]) / "checkpoints" / "last.ckpt")
    run_dir = tmp_path / "run"
    process = start_fit(run_dir, *args, *DDP, "-c", freeze_config(tmp_path, hook="on_train_batch_end", step=8))
    kill_when_frozen(process, tmp_path / "frozen")
    resume(run_dir, *BASE[len(STAND_IN) :], *args, "--allow_change=world_size")
    moved = torch.load(run_dir / "checkpoints" / "last.ckpt")
    assert moved["global_step"] == reference["global_step"] and moved["batch_layout"]["world_size"] == 1
    for name, weight in reference["state_dict"].items():
        assert (moved["state_dict"][name] - weight).abs().max() < 1e-5, name


def test_a_batch_samplers_run_moved_to_another_number_of_processes_is_refused_with_its_cause(tmp_path):
    """Its batches are the user's, whose sizes the engine cannot change to keep the global batch."""
    run_dir = tmp_path / "run"
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, *SAMPLED["bucketing"])
    checkpoint_path = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    checkpoint["rng_states"] = {
        name: rows.repeat(2, *[1] * (rows.dim() - 1)) for name, rows in checkpoint["rng_states"].items()
    }  # fmt: skip (as if saved by 2)
    DurableCheckpointIO().save_checkpoint(checkpoint, checkpoint_path)  # (with its digest, as a run writes it)
    with pytest.raises(SystemExit) as stop:
        cli("fit", f"--trainer.default_root_dir={run_dir}", "--ckpt_path=last", *QUICK, *SAMPLED["bucketing"],
            "--allow_change=world_size")  # fmt: skip
    assert str(stop.value.code) == (
        f"error: --ckpt_path {checkpoint_path} was saved by 2 processes and this run has 1, and its train loader "
        "cannot go on on another number of processes: it draws batches with a batch sampler of its own "
        "(BucketBatches), whose batches the engine cannot regroup into the same global batches: resume it on 2"
    )


def test_batched_reads_moved_to_another_number_of_processes_say_their_draws_differ(tmp_path, capsys):
    run_dir = tmp_path / "run"
    cli("fit", f"--trainer.default_root_dir={run_dir}", "--trainer.max_steps=6", "--trainer.limit_val_batches=1",
        *SAMPLED["batch_reads"])  # fmt: skip
    path = run_dir / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["rng_states"] = {
        name: rows.repeat(2, *[1] * (rows.dim() - 1)) for name, rows in checkpoint["rng_states"].items()
    }  # fmt: skip (as if saved by 2)
    checkpoint["batch_layout"].update(world_size=2, batch_size=32)
    DurableCheckpointIO().save_checkpoint(checkpoint, path)
    capsys.readouterr()
    resume(run_dir, "--trainer.max_steps=8", "--trainer.limit_val_batches=1", *SAMPLED["batch_reads"],
           "--allow_change=world_size")  # fmt: skip
    notices = [line for line in capsys.readouterr().err.splitlines() if line.startswith("notice:")]
    assert notices == [
        "notice: this run moved from 2 to 1 processes and goes on inexactly: its train dataset (NoisyBatches) reads a "
        "batch at a time, its random draws seeded per batch, and another number of processes batches other samples, "
        "so from here it differs from the run that never moved"
    ]
