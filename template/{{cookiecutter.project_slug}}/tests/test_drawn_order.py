"""A sampler or batch sampler of the user's own is drawn once an epoch from (seed, epoch) (engine/data/drawn_order.py):
the same order in every run, its draws apart from the model's, each process an equal share, and a checkpoint's epoch
drawn again to check that its order repeats."""

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SubsetRandomSampler, WeightedRandomSampler

from template_package.engine.data.drawn_order import DrawnOrderSampler
from template_package.engine.data.loaders import resumable_loader, why_not_resumable

from helpers.sampled_data import BucketBatches, SystemRandomSampler
from helpers.stand_in import synthetic_images

DATA = synthetic_images()["val"]  # 270 samples
N = len(DATA)
WEIGHTS = torch.rand(N, generator=torch.Generator().manual_seed(0))
LOADERS = {
    "replacement": lambda: DataLoader(DATA, batch_size=8, sampler=RandomSampler(DATA, replacement=True)),
    "weighted": lambda: DataLoader(DATA, batch_size=8, sampler=WeightedRandomSampler(WEIGHTS, N)),
    "own_generator": lambda: DataLoader(
        DATA, batch_size=8, sampler=SubsetRandomSampler(range(0, N, 2), generator=torch.Generator().manual_seed(0))
    ),  # fmt: skip
    "batch_sampler": lambda: DataLoader(DATA, batch_sampler=BatchSampler(RandomSampler(DATA), 8, False)),
    "bucketing": lambda: DataLoader(DATA, batch_sampler=BucketBatches([i % 7 for i in range(N)], 8, bucket=40)),
    "list": lambda: DataLoader(DATA, batch_size=8, sampler=list(reversed(range(N)))),
}


def targets_read(loader: DataLoader, epoch: int) -> list[list[int]]:
    loader.sampler.set_epoch(epoch)
    return [batch[1].tolist() for batch in loader]


@pytest.mark.parametrize("kind", LOADERS)
def test_a_users_sampler_is_drawn_from_the_seed_and_the_epoch_alone(kind):
    """Two runs (fresh loaders) read the same batches each epoch, the epochs differ (but the list), and reading them
    draws nothing from torch's global generator, which the model's dropout uses."""
    assert why_not_resumable(LOADERS[kind]()) is None
    runs = [resumable_loader(LOADERS[kind](), seed=3, epoch=0) for _ in range(2)]
    assert all(isinstance(run.sampler, DrawnOrderSampler) for run in runs)
    before = torch.get_rng_state()
    first, again = ([targets_read(run, epoch) for epoch in (0, 1)] for run in runs)
    assert torch.equal(torch.get_rng_state(), before)
    assert first == again and len(first[0]) == len(runs[0])
    assert (first[0] == first[1]) == (kind == "list")


@pytest.mark.parametrize("kind", ["weighted", "bucketing"])
def test_each_process_reads_its_share_of_one_drawn_order_in_as_many_batches(kind):
    whole = resumable_loader(LOADERS[kind](), seed=3, epoch=2)
    ranks = [resumable_loader(LOADERS[kind](), seed=3, epoch=2, num_replicas=2, rank=rank) for rank in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(whole) // 2
    shares = [targets_read(rank, 2) for rank in ranks]
    order = targets_read(whole, 2)
    if kind == "bucketing":  # each rank takes every other batch
        assert shares[0] + shares[1] == order[0 : len(ranks[0]) * 2 : 2] + order[1 : len(ranks[0]) * 2 : 2]
    else:  # each rank takes every other sample
        flat = [target for batch in order for target in batch]
        assert [t for batch in shares[0] for t in batch] == flat[0 : len(flat) // 2 * 2 : 2][: len(ranks[0]) * 8]


def test_a_checkpoints_epoch_drawn_again_shows_whether_the_order_repeats():
    seeded = DrawnOrderSampler(BucketBatches([i % 7 for i in range(N)], 8), seed=1, batches=True)
    seeded.set_epoch(1)
    record = seeded.record(positions=5)
    later = DrawnOrderSampler(BucketBatches([i % 7 for i in range(N)], 8), seed=1, batches=True)
    later.set_epoch(2)  # resumed at the epoch's end: the next epoch
    assert later.matches(record) and later.epoch == 2
    seeded.set_epoch(2)
    assert list(later) == list(seeded)
    system = DrawnOrderSampler(SystemRandomSampler(N), seed=1)
    assert not DrawnOrderSampler(SystemRandomSampler(N), seed=1).matches(system.record(positions=5))


class CountingSampler(torch.utils.data.Sampler):
    """A sampler with a state of its own: each epoch starts where the previous one's draws left its counter."""

    def __init__(self) -> None:
        self.count = 0

    def __iter__(self):
        self.count += 1
        return iter(torch.arange(N).roll(self.count).tolist())

    def __len__(self) -> int:
        return N

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.count = state["count"]


@pytest.mark.parametrize("resumed_epoch", [1, 2], ids=["mid_epoch", "at_its_end"])
def test_a_samplers_own_state_is_put_back_on_resume(resumed_epoch):
    run, orders = DrawnOrderSampler(CountingSampler(), seed=0), {}
    for epoch in (0, 1, 2):
        run.set_epoch(epoch)
        orders[epoch] = list(run)
        if epoch == 1:
            record = run.record(positions=10)
    resumed = DrawnOrderSampler(CountingSampler(), seed=0)
    resumed.set_epoch(resumed_epoch)
    assert resumed.matches(record)
    assert list(resumed) == orders[resumed_epoch]
