"""Bad input: one clear line that names the bad value, a non-zero exit, and an existing run left byte-identical."""

import shutil
from pathlib import Path

import pytest
import torch

from helpers.cli import QUICK, cli, cli_subprocess

MODEL = "helpers.stand_in.StandInClassifier"


def error_line(*args: str) -> str:
    """Run the CLI in this process and return its error message, checked to be one line."""
    with pytest.raises(SystemExit) as exit_info:
        cli(*args)
    message = str(exit_info.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """The bytes of the run's checkpoints and config."""
    files = [*run_dir.glob("checkpoints/*"), run_dir / "config.yaml"]
    return {str(path.relative_to(run_dir)): path.read_bytes() for path in files}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK)
    return run_dir


@pytest.fixture
def existing_run(finished_run, tmp_path) -> Path:
    """A copy of a finished run that a failing command must leave exactly as it was."""
    run_dir = tmp_path / "existing"
    shutil.copytree(finished_run, run_dir)
    return run_dir


def test_unknown_option_suggests_the_close_one():
    assert error_line("fit", "--model.lrr=0.1") == (
        f"error: unknown option --model.lrr for {MODEL}: did you mean --model.lr?"
    )


def test_unknown_key_in_a_config_file_suggests_the_close_one(tmp_path):
    config = tmp_path / "typo.yaml"
    config.write_text("model:\n  lrr: 0.1\n")
    assert error_line("fit", "-c", str(config)) == (
        f"error: unknown option model.lrr for {MODEL}: did you mean model.lr?"
    )


def test_an_abbreviated_option_is_not_taken_for_the_whole_one():
    """argparse would take --trainer.max_epoch for --trainer.max_epochs, silently."""
    assert error_line("fit", "--trainer.max_epoch=3") == (
        "error: unknown option --trainer.max_epoch: did you mean --trainer.max_epochs?"
    )


def test_wrong_type_names_the_key_and_value():
    message = error_line("fit", "--model.lr=abc")
    assert "model.lr" in message and "abc" in message and "float" in message


def test_invalid_precision_lists_the_valid_ones():
    message = error_line("fit", "--trainer.precision=bf17")
    assert message.startswith("error: trainer.precision='bf17' is not a precision: use one of auto, ")
    assert "bf16-mixed" in message and "16-mixed" in message


def test_missing_config_file_is_named():
    message = error_line("fit", "-c", "configs/nope.yaml")
    assert "nope.yaml" in message and "does not exist" in message


def test_accumulation_below_one_is_refused(run_dir):
    message = error_line("fit", f"--trainer.default_root_dir={run_dir}", "--trainer.accumulate_grad_batches=0")
    assert message == "error: trainer.accumulate_grad_batches=0 must be a whole number >= 1"


def test_warmup_longer_than_the_run_is_refused_before_anything_is_written(run_dir):
    message = error_line("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--model.warmup=1000")
    assert "warmup of 1000 optimizer steps" in message and "whole run of 12 optimizer steps" in message
    assert not (run_dir / "config.yaml").exists() and not list(run_dir.glob("checkpoints/*"))


def test_missing_checkpoint_is_named(existing_run):
    message = error_line("validate", f"--trainer.default_root_dir={existing_run}", "--ckpt_path=nope.ckpt")
    assert message == "error: --ckpt_path nope.ckpt does not exist: give the path of a .ckpt file or sharded folder"


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_damaged_checkpoint_is_refused_and_the_run_kept(existing_run, tmp_path, damage):
    before = snapshot(existing_run)
    good = (existing_run / "checkpoints" / "last.ckpt").read_bytes()
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(good[: len(good) // 2] if damage == "truncated" else b"\x00garbage" * 100)
    message = error_line("fit", f"--trainer.default_root_dir={tmp_path / 'new'}", f"--ckpt_path={bad}")
    assert f"--ckpt_path {bad} is truncated or corrupted" in message
    assert snapshot(existing_run) == before


def test_checkpoint_of_another_architecture_lists_the_mismatches(existing_run, tmp_path):
    checkpoint = torch.load(existing_run / "checkpoints" / "last.ckpt", weights_only=True)
    del checkpoint["state_dict"]["net.8.bias"]
    checkpoint["state_dict"]["net.8.weight"] = torch.zeros(5, 512)
    other = tmp_path / "other.ckpt"
    torch.save(checkpoint, other)
    message = error_line("validate", f"--trainer.default_root_dir={existing_run}", f"--ckpt_path={other}")
    assert "is for another architecture (missing net.8.bias; net.8.weight is (5, 512) in the checkpoint" in message
    assert "strict=False" in message


class Arbitrary:
    """A class that only unpickling can rebuild."""


def test_checkpoint_needing_unpickling_is_refused_with_the_way_out(tmp_path):
    unsafe = tmp_path / "unsafe.ckpt"
    torch.save({"state_dict": {}, "extra": Arbitrary()}, unsafe)
    message = error_line("test", f"--ckpt_path={unsafe}")
    assert "unpickling runs arbitrary code, so it was refused" in message
    assert message.endswith("if you trust the file, add --weights_only false")


def test_non_finite_loss_stops_without_overwriting_the_last_good_checkpoint(run_dir):
    message = error_line(
        "fit", f"--trainer.default_root_dir={run_dir}", "--model.lr=1e30", "--model.warmup=0",
        "--last_checkpoint.every_n_steps=1", "--trainer.enable_progress_bar=false",
    )  # fmt: skip
    assert message.startswith("error: train/loss is nan at global step ") and "batch" in message, message
    failed_step = int(message.split("global step ")[1].split(",")[0])
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == failed_step  # the state before the bad step, not after it
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())


def test_async_checkpoint_io_is_refused_before_training(run_dir):
    """It returns before its write is done: last.ckpt's fsync and rename could not wait for it."""
    message = error_line("fit", f"--trainer.default_root_dir={run_dir}", *QUICK,
                         "--trainer.plugins=lightning.pytorch.plugins.io.AsyncCheckpointIO")  # fmt: skip
    assert "AsyncCheckpointIO" in message and "leave it out" in message
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()


def test_run_dir_that_cannot_be_created_fails_before_training(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert error_line("fit", f"--trainer.default_root_dir={blocker / 'run'}") == (
        f"error: cannot write the run directory {blocker / 'run'} (Not a directory): give another "
        "--trainer.default_root_dir"
    )
    assert "Epoch" not in capsys.readouterr().out


# --- Errors by type: one line for a mistake, a traceback for a bug, wherever it was raised ----------------------------


@pytest.mark.parametrize("when", ["init", "training_step"])
def test_a_value_error_in_the_users_own_model_keeps_its_traceback(run_dir, when):
    """A `raise ValueError` in the user's model is a bug to find: the same error, with its traceback (in the model's
    own code, not jsonargparse's wrapper around a class that failed while it was built)."""
    with pytest.raises(ValueError, match=f"ValueError raised at {when}") as raised:
        cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--model=helpers.stand_in.FailingClassifier",
            f"--model.when={when}")  # fmt: skip
    assert type(raised.value) is ValueError
    assert raised.traceback[-1].path.name == "stand_in.py"


def test_a_bug_in_a_subprocess_prints_its_traceback(run_dir):
    result = cli_subprocess(
        "fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--model=helpers.stand_in.FailingClassifier"
    )
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "in training_step" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "ValueError: ValueError raised at training_step"


@pytest.mark.parametrize("when", ["init", "training_step"])
def test_the_projects_own_error_type_raised_in_the_users_code_is_one_line(run_dir, when):
    message = error_line("fit", f"--trainer.default_root_dir={run_dir}", *QUICK,
                         "--model=helpers.stand_in.FailingClassifier", "--model.error=UsageError",
                         f"--model.when={when}")  # fmt: skip
    assert message == f"error: UsageError raised at {when}"


@pytest.mark.parametrize("data", ["LateClassesData", "UndeclaredClassesData"])  # None in __init__, or not there
def test_a_value_the_data_sets_only_in_setup_stops_the_run_in_one_line(run_dir, data):
    message = error_line("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, f"--data=helpers.stand_in.{data}")
    assert message == (
        f"error: model.num_classes is left to the data, but {data}.num_classes is still None when the model is built "
        f"(a value set in setup(), which runs later): set self.num_classes in {data}.__init__, give "
        "--model.num_classes, or build the layers that need it in the model's configure_model(), which Lightning "
        "calls after setup()"
    )
    assert not list(run_dir.glob("checkpoints/*"))


def test_a_model_that_builds_its_layers_in_configure_model_takes_the_value_set_in_setup(run_dir):
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--data=helpers.stand_in.LateClassesData",
        "--model=helpers.stand_in.LateHeadClassifier")  # fmt: skip
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["state_dict"]["net.8.weight"].shape[0] == 10


@pytest.mark.slow
def test_a_model_that_builds_its_layers_in_configure_model_trains_under_ddp(run_dir):
    """Each DDP rank's DataModule runs setup() once, before configure_model: every rank builds the same head."""
    from helpers.runs import DDP, finish, start_fit

    finish(
        start_fit(
            run_dir,
            *QUICK,
            *DDP,
            "--data=helpers.stand_in.LateClassesData",
            "--model=helpers.stand_in.LateHeadClassifier",
        )
    )
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["state_dict"]["net.8.weight"].shape[0] == 10 and checkpoint["global_step"] > 0
