import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits

from template_package.data import EpochShuffleSampler, ImageDataModule, digits_splits


def test_digits_split_is_disjoint_complete_and_fixed():
    train, val, test = digits_splits(0.15, 0.15, seed=0)
    assert (len(train), len(val), len(test)) == (1257, 270, 270)
    again = digits_splits(0.15, 0.15, seed=0)
    torch.testing.assert_close(val.tensors[0], again[1].tensors[0])
    # Together the three splits are exactly the 1,797 digits: compare them as multisets of images.
    images = torch.cat([train.tensors[0], val.tensors[0], test.tensors[0]]).flatten(1).double()
    original = torch.from_numpy(load_digits().data).double() / 16.0
    key = torch.rand(64, dtype=torch.float64)
    torch.testing.assert_close((images @ key).sort().values, (original @ key).sort().values)


def test_loaders_shuffle_and_drop_last_only_for_training():
    dm = ImageDataModule(batch_size=100)
    dm.setup("fit")
    train, val = dm.train_dataloader(), dm.val_dataloader()
    assert train.drop_last and not val.drop_last
    assert isinstance(train.sampler, EpochShuffleSampler)
    assert type(val.sampler).__name__.endswith("SequentialSampler")
    assert len(train) == 1257 // 100 and len(val) == 3
    assert not train.pin_memory or torch.cuda.is_available()
    assert dm.num_workers == 0  # digits sit in memory: workers would only add IPC


def test_image_folder_tree_is_read_with_its_classes(tmp_path):
    for split in ("train", "val"):
        for label, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
            folder = tmp_path / split / label
            folder.mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (40, 30), color).save(folder / f"{i}.png")
    dm = ImageDataModule(data_dir=str(tmp_path), batch_size=2, num_workers=0, image_size=16)
    assert dm.classes == ["cat", "dog"] and dm.num_classes == 2 and dm.in_channels == 3
    dm.setup("fit")
    images, targets = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 3, 16, 16) and images.dtype == torch.float32
    val_images, val_targets = next(iter(dm.val_dataloader()))
    assert val_targets.tolist() == [0, 0]  # evaluation keeps file order
    assert val_images.shape == (2, 3, 16, 16)


def test_missing_train_folder_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no train/ folder"):
        ImageDataModule(data_dir=str(tmp_path))
