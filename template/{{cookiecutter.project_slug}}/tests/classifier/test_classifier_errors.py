"""The example's data mistakes: one clear line naming the folder, file or value, and a non-zero exit."""

from pathlib import Path

import pytest
import torch
from PIL import Image

from template_package.classifier.data import check_finite

from helpers.classifier_task import CLASSIFIER, error_line
from helpers.cli import cli_subprocess


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
        task=CLASSIFIER,
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
