"""Your own images: random augmentation in loader workers that resumes exactly and does not depend on the number of
workers, and `predict` on a folder of new images with nothing but the checkpoint."""

import csv
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from helpers.classifier_task import CLASSIFIER
from helpers.cli import cli
from helpers.runs import assert_kill_and_resume_exact

CLASSES = ["cat", "dog", "owl"]


def make_tree(root: Path, per_class: int = 16) -> Path:
    """train/ and val/ folders of noisy 24x20 RGB images, one mean colour per class."""
    generator = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for c, name in enumerate(CLASSES):
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                pixels = (torch.rand(20, 24, 3, generator=generator) * 120 + 60 * c).to(torch.uint8)
                Image.fromarray(pixels.numpy()).save(root / split / name / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("images") / "tree")


def image_args(tree: Path) -> list[str]:
    """3 epochs of 6 batches of 8 random crops of 16 pixels, flipped at random."""
    return [f"--data.data_dir={tree}", "--data.image_size=16", "--data.batch_size=8", "--trainer.max_epochs=3",
            "--trainer.enable_progress_bar=false", "--trainer.limit_val_batches=2"]  # fmt: skip


def test_the_same_augmentations_whatever_the_number_of_workers(tree, tmp_path):
    """Each sample's crop and flip come from (seed, epoch, index): 0, 1, 2 and 4 workers train the same bits."""
    weights = {}
    for workers in (0, 1, 2, 4):
        run_dir = tmp_path / f"workers{workers}"
        cli(
            "fit",
            f"--trainer.default_root_dir={run_dir}",
            *image_args(tree),
            f"--data.num_workers={workers}",
            task=CLASSIFIER,
        )
        weights[workers] = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for workers in (1, 2, 4):
        assert all(torch.equal(weights[0][k], weights[workers][k]) for k in weights[0]), workers


@pytest.mark.slow
def test_augmented_run_killed_mid_epoch_with_two_workers_resumes_bit_identical(tree, tmp_path, tmp_path_factory):
    """The outside harness: SIGKILL at step 8 (mid-epoch 1) with 2 loader workers drawing random crops and flips;
    the resumed run draws the same ones for the rest of the epoch."""
    args = [*CLASSIFIER, *image_args(tree), "--data.num_workers=2", "--last_checkpoint.every_n_steps=4",
            "--trainer.log_every_n_steps=1"]  # fmt: skip
    assert_kill_and_resume_exact(tmp_path, tmp_path_factory, args, hook="on_train_batch_end", step=8)


def test_predict_on_a_folder_of_new_images_needs_only_the_checkpoint(tree, tmp_path, monkeypatch):
    """Trained on the tree, which then goes away; predict on nested unlabeled images with --ckpt_path and
    --data.predict_dir only: class names, image size and channels come from the checkpoint."""
    from template_package.classifier.images import image_folder_transforms, load_rgb_image
    from template_package.classifier.model import ImageClassifier

    run_dir = tmp_path / "run"
    data = shutil.copytree(tree, tmp_path / "data")
    cli("fit", f"--trainer.default_root_dir={run_dir}", *image_args(data), "--trainer.max_epochs=1", task=CLASSIFIER)
    shutil.rmtree(data)
    new = tmp_path / "new"
    for i, source in enumerate(sorted((tree / "val").rglob("*.png"))[::8]):
        (new / f"batch{i % 2}").mkdir(parents=True, exist_ok=True)
        shutil.copy(source, new / f"batch{i % 2}" / f"{i}.png")
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    monkeypatch.chdir(tmp_path)  # nothing relative to the project either
    cli(
        "predict",
        f"--trainer.default_root_dir={run_dir}",
        f"--ckpt_path={checkpoint}",
        f"--data.predict_dir={new}",
        task=CLASSIFIER,
    )
    rows = list(csv.DictReader((run_dir / "predictions.csv").open()))
    files = sorted(str(p) for p in new.rglob("*.png"))
    assert [row["file"] for row in rows] == files and len(files) == 6
    model = ImageClassifier.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    evaluate = image_folder_transforms(16)[1]
    with torch.no_grad():
        probabilities = model(torch.stack([evaluate(load_rgb_image(f)) for f in files])).softmax(-1)
    for row, p in zip(rows, probabilities, strict=True):
        assert row["prediction"] == CLASSES[int(p.argmax())]
        assert [float(row[f"p_{c}"]) for c in CLASSES] == pytest.approx(p.tolist(), abs=1e-5)


def test_an_undecodable_new_image_is_named_and_nothing_is_written(tree, tmp_path):
    run_dir = tmp_path / "run"
    cli("fit", f"--trainer.default_root_dir={run_dir}", *image_args(tree), "--trainer.max_epochs=1", task=CLASSIFIER)
    new = tmp_path / "new"
    new.mkdir()
    shutil.copy(next((tree / "val" / "cat").glob("*.png")), new / "good.png")
    (new / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(SystemExit) as stop:
        cli("predict", f"--trainer.default_root_dir={run_dir}", f"--ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
            f"--data.predict_dir={new}", "--data.num_workers=0", task=CLASSIFIER)  # fmt: skip
    assert stop.value.code == f"error: cannot decode the image {new / 'broken.jpg'} (UnidentifiedImageError): fix or " \
        "delete it"  # fmt: skip
    assert not (run_dir / "predictions.csv").exists()
