"""The Throughput callback's data-wait share is the loader's fetch time, not the rest of the loop's bookkeeping."""

import dataclasses
import time

import lightning as L
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

from template_package.engine.report.throughput import Throughput, samples_in

from helpers.stand_in import StandInClassifier


class SlowImages(Dataset):
    """Random 8x8 images fetched a batch at a time (the loader passes a list of indices); each batch sleeps `delay`
    seconds, and costs next to nothing otherwise, so `delay` is the whole fetch time."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.images, self.targets = torch.rand(64 * 12, 1, 8, 8), torch.randint(0, 10, (64 * 12,))

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, indices: list[int]):
        time.sleep(self.delay)
        return self.images[indices], self.targets[indices]


class TimedLoader(DataLoader):
    """A DataLoader that records how long each `next()` of its iterator takes: the fetch time, measured beside the
    callback (on a loaded machine the scheduler's delays inside a fetch are part of it)."""

    fetches: list[float]

    def __iter__(self):
        iterator, self.fetches = super().__iter__(), []
        while True:
            started = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.fetches.append(time.perf_counter() - started)
            yield batch


class TenMillisecondSteps(StandInClassifier):
    """The stand-in with a step as long as a real model's small one (~10 ms): the loader's own bookkeeping around each
    fetch, a fraction of a millisecond, then weighs what it does in a real run."""

    def training_step(self, batch, batch_idx):
        time.sleep(0.01)
        return super().training_step(batch, batch_idx)


class BatchStarts(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.times.append(time.perf_counter())


@pytest.mark.parametrize("delay", [0.0, 0.1])
def test_data_wait_share_is_the_fetch_time_over_the_step_interval(tmp_path, delay):
    starts = BatchStarts()
    trainer = L.Trainer(
        max_steps=11, log_every_n_steps=11, callbacks=[Throughput(), starts], default_root_dir=tmp_path,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    dataset = SlowImages(delay)
    batches = BatchSampler(SequentialSampler(dataset), 64, drop_last=True)
    loader = TimedLoader(dataset, sampler=batches, batch_size=None)
    trainer.fit(TenMillisecondSteps(num_classes=10, in_channels=1, warmup=1), loader)
    throughput = next(c for c in trainer.callbacks if isinstance(c, Throughput))
    share = throughput.latest["perf/data_wait_share"]
    # One step and the fetch of the next batch. (In float64: perf_counter reads thousands of seconds, where float32
    # steps by ~1 ms, which put this reference off by up to 1.4% of a ~12 ms interval.)
    interval = (starts.times[-1] - starts.times[0]) / (len(starts.times) - 1)
    expected = sum(loader.fetches[1:]) / len(loader.fetches[1:]) / interval  # one fetch per step, after the first's
    assert share == pytest.approx(expected, abs=0.05)
    if delay:
        assert share > 0.6 and expected > 0.6
    assert throughput.latest["perf/samples_per_sec"] == pytest.approx(64 / interval, rel=0.01)


@dataclasses.dataclass
class Pair:
    inputs: object
    targets: object


class Record:
    def __init__(self, inputs) -> None:
        self.inputs = inputs


@pytest.mark.parametrize(
    ("batch", "samples"),
    [
        (torch.zeros(5, 3), 5),
        ((torch.zeros(6, 2), torch.zeros(6)), 6),
        ([torch.zeros(7), torch.zeros(3)], 7),
        ({"text": ["a", "b"], "ids": torch.zeros(4, 9)}, 4),
        ((["a"], torch.zeros(8, 1)), 8),
        ((torch.tensor(1.0), torch.zeros(3, 2)), 1),  # Lightning's rule: a 0-d tensor counts as one sample
        (Pair(torch.zeros(2, 5), torch.zeros(2)), 2),
        (Record(torch.zeros(9, 1)), 9),
        (["no", "tensor"], 1),
    ],
)
def test_samples_in_a_batch_count_its_first_tensors_first_dimension_as_lightning_does(batch, samples):
    from lightning.pytorch.utilities.data import extract_batch_size

    assert samples_in(batch) == samples
    if isinstance(batch, torch.Tensor | tuple | list | dict) and samples != 1:
        assert extract_batch_size(batch) == samples  # the fast path agrees with Lightning's own
