import pytest
import torch
from PIL import Image
from sklearn.datasets import load_digits
from torch.utils.data import BatchSampler

from template_package.classifier.data import EpochShuffleSampler, ImageDataModule, digits_splits


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
    assert isinstance(train.sampler, EpochShuffleSampler)
    assert type(val.sampler).__name__.endswith("SequentialSampler")
    assert [len(y) for _, y in train] == [100] * (1257 // 100)  # the last partial batch is dropped
    assert [len(y) for _, y in val] == [100, 100, 70]
    assert not train.pin_memory or torch.cuda.is_available()
    assert dm.num_workers == 0  # digits sit in memory: workers would only add IPC


def test_in_memory_batches_equal_per_sample_batching():
    """The batch-at-a-time path for in-memory tensors yields exactly what per-sample loading and stacking would."""
    dm = ImageDataModule(batch_size=64)
    dm.setup("fit")
    dataset, loader = dm.datasets["train"], dm.train_dataloader()
    per_sample = BatchSampler(EpochShuffleSampler(len(dataset), torch.initial_seed()), 64, drop_last=True)
    for epoch in (0, 3):
        loader.sampler.set_epoch(epoch)
        per_sample.sampler.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(loader) == len(per_sample) == 19
        for (images, targets), indices in zip(batches, per_sample, strict=True):
            samples = [dataset[i] for i in indices]
            assert torch.equal(images, torch.stack([x for x, _ in samples]))
            assert torch.equal(targets, torch.stack([y for _, y in samples]))


def test_each_rank_shuffles_its_own_share_anew_every_epoch():
    """Under DDP every rank reads a disjoint share of one (seed, epoch) permutation, and set_epoch changes it."""
    shares = {}
    for epoch in (0, 1):
        ranks = [EpochShuffleSampler(1257, seed=42, num_replicas=2, rank=rank) for rank in (0, 1)]
        for sampler in ranks:
            sampler.set_epoch(epoch)
        shares[epoch] = [list(sampler) for sampler in ranks]
        assert len(shares[epoch][0]) == len(shares[epoch][1]) == 628
        assert not set(shares[epoch][0]) & set(shares[epoch][1])
        whole = EpochShuffleSampler(1257, seed=42)
        whole.set_epoch(epoch)
        order = list(whole)
        assert shares[epoch][0] == order[0:1256:2] and shares[epoch][1] == order[1:1256:2]
    assert shares[0][0] != shares[1][0]
    batched = EpochShuffleSampler(1257, seed=42, batch_size=64, num_replicas=2, rank=1)
    batched.set_epoch(1)
    assert len(batched) == 9 and sum(list(batched), []) == shares[1][1][: 9 * 64]


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
    with pytest.raises(ValueError, match="has no train/ folder"):
        ImageDataModule(data_dir=str(tmp_path))
