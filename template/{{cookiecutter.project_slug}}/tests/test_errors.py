"""Bad input: one clear line that names the bad value, a non-zero exit, and an existing run left byte-identical."""

import shutil
from pathlib import Path

import pytest
import torch
from conftest import QUICK, cli, cli_subprocess
from PIL import Image

from template_package.classifier.data import check_finite

MODEL = "template_package.classifier.model.ImageClassifier"


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
    assert message == "error: --ckpt_path nope.ckpt does not exist: give the path of a .ckpt file"


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
    del checkpoint["state_dict"]["net.head.bias"]
    checkpoint["state_dict"]["net.head.weight"] = torch.zeros(5, 128)
    other = tmp_path / "other.ckpt"
    torch.save(checkpoint, other)
    message = error_line("validate", f"--trainer.default_root_dir={existing_run}", f"--ckpt_path={other}")
    assert (
        "is for another architecture (missing net.head.bias; net.head.weight is (5, 128) in the checkpoint" in message
    )
    assert "strict=False" in message


class Arbitrary:
    """A class that only unpickling can rebuild."""


def test_checkpoint_needing_unpickling_is_refused_with_the_way_out(tmp_path):
    unsafe = tmp_path / "unsafe.ckpt"
    torch.save({"state_dict": {}, "extra": Arbitrary()}, unsafe)
    message = error_line("test", f"--ckpt_path={unsafe}")
    assert "unpickling runs arbitrary code, so it was refused" in message
    assert message.endswith("if you trust the file, add --weights_only false")


def make_image_folder(root: Path, classes: list[str], bad_image: bool = False) -> None:
    for split in ("train", "val"):
        for i, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for j in range(4):
                Image.new("RGB", (20, 20), (60 * i, 20 * j, 0)).save(root / split / name / f"{j}.png")
    if bad_image:
        (root / "train" / classes[0] / "broken.png").write_bytes(b"not a png at all")


def test_missing_data_dir_is_named(tmp_path, run_dir):
    message = error_line("fit", f"--data.data_dir={tmp_path / 'nowhere'}", f"--trainer.default_root_dir={run_dir}")
    assert f"data_dir='{tmp_path / 'nowhere'}' has no train/ folder" in message


@pytest.mark.parametrize("classes, found", [([], "no class folders"), (["cat"], "only the class folder 'cat'")])
def test_data_dir_without_two_classes_is_refused(tmp_path, run_dir, classes, found):
    make_image_folder(tmp_path / "data", classes)
    (tmp_path / "data" / "train").mkdir(parents=True, exist_ok=True)
    message = error_line("fit", f"--data.data_dir={tmp_path / 'data'}", f"--trainer.default_root_dir={run_dir}")
    assert found in message and "2 classes or more" in message


def test_undecodable_image_is_reported_with_its_path(tmp_path):
    make_image_folder(tmp_path / "data", ["cat", "dog"], bad_image=True)
    broken = tmp_path / "data" / "train" / "cat" / "broken.png"
    result = cli_subprocess(
        "fit", f"--data.data_dir={tmp_path / 'data'}", "--data.image_size=16", "--data.batch_size=9",
        "--data.num_workers=1", f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.max_epochs=1",
    )  # fmt: skip
    assert result.returncode != 0
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"error: cannot decode the image {broken} (UnidentifiedImageError): fix or delete it"
    )  # noqa: E501
    assert "Traceback" not in result.stderr


def test_non_finite_inputs_are_found_before_training():
    images = torch.rand(5, 1, 8, 8)
    images[3, 0, 2, 2] = float("nan")
    with pytest.raises(ValueError, match="non-finite values .* in 1 samples, first at index 3"):
        check_finite(images, "digits")


def test_non_finite_loss_stops_without_overwriting_the_last_good_checkpoint(run_dir):
    result = cli_subprocess(
        "fit", f"--trainer.default_root_dir={run_dir}", "--model.lr=1e30", "--model.warmup=0",
        "--last_checkpoint.every_n_steps=1", "--trainer.enable_progress_bar=false",
    )  # fmt: skip
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: train/loss is nan at global step ") and "batch" in last_line, last_line
    assert "Traceback" not in result.stderr
    failed_step = int(last_line.split("global step ")[1].split(",")[0])
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == failed_step  # the state before the bad step, not after it
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())


def test_async_checkpoint_io_is_refused_before_training(run_dir):
    """It returns before its write is done: last.ckpt's fsync and rename could not wait for it."""
    message = error_line("fit", f"--trainer.default_root_dir={run_dir}", *QUICK,
                         "--trainer.plugins=lightning.pytorch.plugins.io.AsyncCheckpointIO")  # fmt: skip
    assert "AsyncCheckpointIO" in message and "leave it out" in message
    assert not (run_dir / "checkpoints" / "last.ckpt").exists()


def test_run_dir_that_cannot_be_created_fails_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    result = cli_subprocess("fit", f"--trainer.default_root_dir={blocker / 'run'}")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot write the run directory {blocker / 'run'} (Not a directory): give another "
        "--trainer.default_root_dir"
    )
    assert "Traceback" not in result.stderr and "Epoch" not in result.stdout
