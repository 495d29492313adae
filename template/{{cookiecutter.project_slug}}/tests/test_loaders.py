"""Train loaders that resume exactly for any map-style dataset (engine/data/loaders.py): the user's plain DataLoader or
StatefulDataLoader is rebuilt by the engine; one the engine cannot make exact gets one notice that says so."""

import random

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from template_package.engine.data.loaders import resumable_loader
from template_package.engine.data.sampling import EpochShuffleSampler, SeededSamples, sample_seed

from helpers.cli import QUICK, cli, extra_config
from helpers.runs import weights_with_workers
from helpers.stand_in import Noisy, synthetic_images


def test_a_plain_loader_is_rebuilt_with_its_own_settings():
    train = Noisy(synthetic_images()["train"])
    loader = DataLoader(train, batch_size=32, shuffle=True, drop_last=True, num_workers=2, persistent_workers=True,
                        collate_fn=list)  # fmt: skip
    rebuilt = resumable_loader(loader, seed=7, epoch=3)
    assert isinstance(rebuilt, StatefulDataLoader) and isinstance(rebuilt.sampler, EpochShuffleSampler)
    assert rebuilt.sampler.epoch == 3 and rebuilt.sampler.seed == 7 and rebuilt.sampler.shuffle
    assert isinstance(rebuilt.dataset, SeededSamples) and rebuilt.dataset.dataset is train
    assert (rebuilt.batch_size, rebuilt.drop_last, rebuilt.num_workers) == (32, True, 2)
    assert rebuilt.persistent_workers and rebuilt.collate_fn is list
    assert len(rebuilt) == len(train) // 32


def test_in_memory_tensors_are_gathered_a_batch_at_a_time_and_equal_per_sample_batching():
    """A TensorDataset's batches come from one index operation each: exactly what per-sample loading and stacking
    would give, in the same (seed, epoch) order."""
    train = synthetic_images()["train"]
    rebuilt = resumable_loader(DataLoader(train, batch_size=64, shuffle=True, drop_last=True), seed=42, epoch=0)
    assert rebuilt.batch_size is None and rebuilt.sampler.batch_size == 64
    per_sample = BatchSampler(EpochShuffleSampler(len(train), 42), 64, drop_last=True)
    for epoch in (0, 3):
        rebuilt.sampler.set_epoch(epoch)
        per_sample.sampler.set_epoch(epoch)
        batches = list(rebuilt)
        assert len(batches) == len(rebuilt) == len(per_sample) == 19
        for (images, targets), indices in zip(batches, per_sample, strict=True):
            samples = [train[i] for i in indices]
            assert torch.equal(images, torch.stack([x for x, _ in samples]))
            assert torch.equal(targets, torch.stack([y for _, y in samples]))
    keep_last = resumable_loader(DataLoader(train, batch_size=64, shuffle=True), seed=42, epoch=0)
    assert len(keep_last) == 20 and len(list(keep_last)[-1][1]) == 1257 - 19 * 64


def test_sample_seed_is_the_seed_of_the_sample_being_read():
    seeds = []

    class Records(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            seeds.append(sample_seed())
            return index

    dataset = SeededSamples(Records(), seed=5)
    dataset[(0, 1, 0)], dataset[(0, 1, 3)], dataset[(1, 1, 0)]
    assert seeds[0] == seeds[1] != seeds[2]  # a sample's own, wherever it is read
    with pytest.raises(RuntimeError, match="only while the engine's train loader reads a sample"):
        sample_seed()


class BatchReads(torch.utils.data.Dataset):
    """A dataset with batched reads (`__getitems__`, as Hugging Face datasets have) that draws a number for each sample
    and counts its calls; its `__getitem__` is never used."""

    vocab = ["a", "b"]

    def __init__(self) -> None:
        self.calls = 0

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int):
        raise AssertionError("read one sample at a time")

    def __getitems__(self, indices: list[int]) -> list:
        self.calls += 1
        return [(index, torch.rand(())) for index in indices]


def test_a_dataset_with_batched_reads_is_read_a_batch_at_a_time_and_exactly_on_resume():
    """One `__getitems__` call a batch, its draws seeded from the batch's position: the same with 0 and 2 workers and
    in a loader resumed mid-epoch; the dataset's own attributes are reached through the engine's wrapper."""

    def rebuilt(workers: int) -> StatefulDataLoader:
        loader = DataLoader(BatchReads(), batch_size=4, shuffle=True, drop_last=True, num_workers=workers)
        return resumable_loader(loader, seed=1, epoch=2)

    main = rebuilt(workers=0)
    assert main.dataset.vocab == ["a", "b"]
    batches = list(main)
    assert len(batches) == 10 and main.dataset.calls == 10
    assert len({draw.item() for _, draws in batches for draw in draws}) == 40  # every batch draws numbers of its own
    assert same_batches(batches, list(rebuilt(workers=2)))
    stopped = rebuilt(workers=0)
    iterator = iter(stopped)
    next(iterator), next(iterator), next(iterator)
    state = stopped.state_dict()
    resumed = rebuilt(workers=0)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert same_batches(batches[3:], rest)


def same_batches(a: list, b: list) -> bool:
    pairs = zip(a, b, strict=True) if len(a) == len(b) else None
    return pairs is not None and all(torch.equal(x, y) for p, q in pairs for x, y in zip(p, q, strict=True))


def test_reading_in_the_main_process_leaves_the_global_generators_as_they_were():
    """With 0 workers the samples are read in the training process: its generators (dropout's, NumPy's in a step, the
    states a checkpoint saves) must come out of a batch as they went in, as with workers, for the same bits."""

    class Draws(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return torch.rand(1).item(), random.random(), np.random.rand()

    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()

    def read(workers: int) -> list:  # (the loader's own base seed drawn from a generator of its own)
        samples = SeededSamples(Draws(), seed=5)
        sampler = EpochShuffleSampler(4, seed=5, with_epoch=True)
        loader = DataLoader(samples, sampler=sampler, batch_size=2, num_workers=workers, generator=torch.Generator())
        return list(loader)

    in_main = read(workers=0)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]
    assert np.array_equal(np.random.get_state()[1], before[2][1]) and np.random.get_state()[2] == before[2][2]
    in_workers = read(workers=2)
    assert all(torch.equal(a, b) for x, y in zip(in_main, in_workers, strict=True) for a, b in zip(x, y, strict=True))


def test_random_draws_in_workers_are_the_same_whatever_their_number(tmp_path):
    """Each sample's noise is drawn from (seed, epoch, index): 0, 1 and 2 workers train the same bits
    (tests/test_controls.py: not so without the per-sample seed)."""
    weights = weights_with_workers(tmp_path, (0, 1, 2))
    for workers in (1, 2):
        assert all(torch.equal(weights[0][k], weights[workers][k]) for k in weights[0]), workers


def test_a_loader_that_cannot_resume_exactly_gets_one_notice_before_training(run_dir, tmp_path, capsys):
    marker = {
        "class_path": "helpers.kill_points.Say",
        "init_args": {"hook": "on_train_batch_start", "text": "first batch"},
    }
    config = extra_config(tmp_path / "say.yaml", callbacks=[marker])
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--data=helpers.stand_in.UnresumableStandInData",
        "-c", config, "--trainer.limit_train_batches=3")  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("notice: the train loader cannot resume exactly") == 1, err
    assert "resume" in err.split("notice:")[1].splitlines()[0]
    assert err.index("notice: the train loader") < err.index("first batch")


def test_a_loader_the_engine_makes_exact_gets_no_notice(run_dir, capsys):
    cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--data.stateful=true")
    assert "notice" not in capsys.readouterr().err


def test_a_loader_without_a_length_and_no_max_steps_gets_one_line_for_the_schedule(run_dir, capsys):
    """The warmup-cosine schedule needs the run's length: an iterable dataset's loader cannot give it."""
    with pytest.raises(SystemExit) as stop:
        cli("fit", f"--trainer.default_root_dir={run_dir}", *QUICK, "--trainer.limit_train_batches=1.0",
            "--data=helpers.stand_in.UnresumableStandInData")  # fmt: skip
    assert str(stop.value.code) == (
        "error: the warmup-cosine schedule needs the run's length in optimizer steps, which a train loader without a "
        "length (a stream's) cannot give: set trainer.max_steps"
    )
