"""Streaming train loaders, whose dataset is an `IterableDataset`, that resume exactly: `ResumableStream` is what
Lightning iterates in place of the loader a DataModule returns (loaders.ResumableLoaders puts it there).

A stream has no index to shuffle or to resume at. What the engine needs is that an epoch's batches repeat, and it
knows two ways a dataset says so (`stream_order`):
- "epochs": the dataset has `set_epoch(epoch)`, its order a function of its seed, the epoch and the number of loader
  workers, as Hugging Face `datasets` streaming (a seeded `.shuffle(seed, buffer_size)` included) and litdata's
  `StreamingDataset` have; or it is a WebDataset pipeline whose shuffles repeat (webdatasets.py), or MosaicML's
  `StreamingDataset` (mosaic.py), which skips the trained samples itself. Each epoch the engine sets the epoch, and a
  resumed run re-reads its epoch's stream from the start and drops the batches trained before the checkpoint. The
  libraries' own states are not used: HF's leaves its shuffle buffer out ("the shuffle buffer will be refilled"), starts
  every later epoch at the restored position and, shuffled and read by 2 workers, raises IndexError when loaded;
  litdata's `StreamingDataLoader` restores until its iterator has run to the end, which Lightning never lets it do (it
  stops at `len()`), and its next epoch raises.
- "state": the dataset has `state_dict`/`load_state_dict` and no `set_epoch`. It is read by torchdata's
  `StatefulDataLoader`, whose state is taken after every batch it reads; a checkpoint holds the one taken when the
  batches it trained had been read, and the run resumes from it.

Either way a checkpoint holds the position of the batches trained (Lightning's loop progress), never of batches read
ahead: from a loader without a length Lightning fetches one batch ahead, so the loader's own state was a batch past
the weights, and the resumed run skipped a batch.

Also:
- The loader workers' seeds come from (seed, epoch, rank, worker): before each epoch's iterator draws its workers'
  base seed, the loader gets a generator of its own seeded from (seed, epoch, rank). Without one it is drawn from the
  global generator, after a resumed run restored it: the resumed run's dropout then differed. Persistent workers are
  started again at each epoch start, the only way the epoch and the seeds reach them.
- Under several processes each rank reads its own part: an HF stream that is not split yet is split by rank with
  `datasets.distributed.split_dataset_by_node` (litdata splits by itself), and, for a loader without a length, the
  ranks agree before each batch whether every one of them still has one (an all-reduce of one number): every rank
  takes the same number of steps, and none is left waiting in a gradient all-reduce at an epoch's end.
- Which samples a batch holds depends on the number of loader workers (each worker builds its own batches from its
  own part of the stream) and of processes: a resume with another number of either is refused (`load_state_dict`).
- With 0 workers the stream is read in the training process: random draws in its own pipeline (an HF `.map()` that
  draws from torch, numpy or random) then come from the training's generators, which a resumed run does not replay.
  With workers they come from the workers' seeds and are exact.

Depends on torch and torchdata, and on `datasets` or `litdata` only for a loader that reads them.
"""

import sys
import time
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from ..errors import UsageError
from ..internals import end_persistent_workers, split_by_node
from . import mosaic, webdatasets
from .sampling import seed_of

KEY = "resumable_stream"  # marks a ResumableStream's state among the loader states Lightning saves
_END = object()  # what `next(iterator, _END)` returns at a stream's end (a batch may be anything, None included)
REMEDY = (
    "give the dataset set_epoch(epoch) with an order that follows from its seed and the epoch (as Hugging Face "
    "datasets' streaming and litdata's StreamingDataset have), or state_dict/load_state_dict and read it with "
    "torchdata's StatefulDataLoader (docs/data.md)"
)


def is_stream(loader) -> bool:
    """A loader of an iterable dataset, or a WebDataset WebLoader."""
    reader = webdatasets.inner_loader(loader)
    return isinstance(reader, DataLoader) and isinstance(reader.dataset, IterableDataset)


def remedy(loader) -> str:
    """What makes the stream `loader` reads resume exactly."""
    if webdatasets.reads_webdataset(loader):
        return "see docs/data.md"
    return REMEDY


def stream_order(loader: DataLoader) -> str | None:
    """How the engine knows that the stream `loader` reads repeats an epoch's order: "epochs" (its dataset has
    set_epoch, or it is a WebDataset pipeline whose stages repeat), "state" (state_dict/load_state_dict), or None when
    it cannot know."""
    if webdatasets.reads_webdataset(loader):
        return "epochs" if webdatasets.why_it_does_not_repeat(loader) is None else None
    dataset = loader.dataset
    if mosaic.is_streaming_dataset(dataset):
        return "epochs"
    if callable(getattr(dataset, "set_epoch", None)):
        return "epochs"
    if callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None)):
        return "state"
    return None


def why_not_exact(loader: DataLoader) -> str | None:
    """Why a `ResumableStream` cannot make the stream `loader` reads resume exactly; None when it can."""
    order = stream_order(loader)
    if order is None and webdatasets.reads_webdataset(loader):
        return webdatasets.why_it_does_not_repeat(loader)
    if order is None:
        return (
            "it reads an iterable dataset without set_epoch or state_dict/load_state_dict: the engine cannot know "
            "that its order repeats"
        )
    if order == "state" and type(loader) not in (DataLoader, StatefulDataLoader):
        return f"it reads an iterable dataset with state_dict/load_state_dict in a {type(loader).__name__}"
    reader = webdatasets.inner_loader(loader)
    if reader.num_workers > 0 and not getattr(reader, "in_order", True):
        return "its workers' batches are taken in the order they arrive (in_order=False)"
    return None


def _litdata_loader(loader: DataLoader) -> bool:
    litdata = sys.modules.get("litdata")  # (a StreamingDataLoader exists only once litdata is imported)
    return litdata is not None and isinstance(loader, litdata.StreamingDataLoader)


def _unsplit_hf_stream(dataset) -> bool:
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(dataset, datasets.IterableDataset) and not split_by_node(dataset)


def prepared(loader: DataLoader, rank: int, world_size: int) -> DataLoader:
    """`loader`, or the same loader rebuilt over this rank's part of an HF stream that is not split yet, or as a
    StatefulDataLoader for a dataset with a state of its own."""
    if webdatasets.is_web_loader(loader):
        return loader
    dataset, loader_class = loader.dataset, type(loader)
    if world_size > 1 and _unsplit_hf_stream(dataset):
        from datasets.distributed import split_dataset_by_node

        if loader_class not in (DataLoader, StatefulDataLoader):
            raise UsageError(
                f"the train loader, a {loader_class.__name__}, reads a datasets stream that is not split between the "
                "processes: split it with datasets.distributed.split_dataset_by_node(dataset, rank, world_size)"
            )
        dataset = split_dataset_by_node(dataset, rank=rank, world_size=world_size)
    if stream_order(loader) == "state":
        loader_class = StatefulDataLoader
    if dataset is loader.dataset and loader_class is type(loader):
        return loader
    workers = loader.num_workers
    return loader_class(
        dataset,
        batch_size=loader.batch_size,
        num_workers=workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        drop_last=loader.drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        prefetch_factor=loader.prefetch_factor if workers else None,
        persistent_workers=loader.persistent_workers if workers else False,
        pin_memory_device=loader.pin_memory_device,
        in_order=loader.in_order,
    )


class ResumableStream:
    """What Lightning iterates in place of a streaming train `loader` (see the module docstring); Lightning saves and
    restores it with the loop's state (it has `state_dict` and `load_state_dict`).

    Args:
        loader: the stream's loader (`prepared`), with a length or without.
        seed: the run's seed.
        fit_loop: the trainer's fit loop, from which the epoch and the batches trained in it are read.
        rank, world_size: this process's rank and the number of processes.
        group: a gloo process group of every rank, for agreeing on equal steps (`cpu_group`), under several
            processes.
    """

    def __init__(self, loader: DataLoader, seed: int, fit_loop, rank: int = 0, world_size: int = 1,
                 group: "torch.distributed.ProcessGroup | None" = None) -> None:  # fmt: skip
        self.loader, self.seed, self.fit_loop = loader, seed, fit_loop
        self.reader = webdatasets.inner_loader(loader)  # the DataLoader that reads the dataset, in workers or not
        self.rank, self.world_size, self.group = rank, world_size, group
        self.order = stream_order(loader)
        self.epoch: int | None = None  # the epoch being read
        self._resume: dict | None = None  # the checkpoint's state, until the next epoch is read
        self._epoch_resume: dict | None = None  # the state the epoch being read started from
        self._snapshots: dict[int, dict] = {}  # "state": the loader's state after each count of batches read

    def __len__(self) -> int:
        return len(self.loader)  # a TypeError for a loader without a length: Lightning then treats it as one

    def state_dict(self) -> dict:
        trained = self.fit_loop.epoch_loop.batch_progress.current.processed
        if self.epoch is None:  # (nothing read yet)
            return self._resume or {}
        state = {KEY: self.order, "epoch": self.epoch, "trained": trained, "num_workers": self.reader.num_workers,
                 "world_size": self.world_size}  # fmt: skip
        if self.order == "state":
            states = [self._snapshots[trained]]
            if self.world_size > 1:  # every rank's: each reads its own part
                states = [None] * self.world_size
                torch.distributed.all_gather_object(states, self._snapshots[trained])
            state["loader"] = states
        return state

    def load_state_dict(self, state: dict) -> None:
        """Called by Lightning before the resumed epoch's iterator is made."""
        if not state:
            return
        if state["world_size"] != self.world_size:
            raise UsageError(
                f"the checkpoint's train stream was read by {state['world_size']} processes and this run has "
                f"{self.world_size}: each process reads its own part of a stream, so another number trains other "
                f"samples; resume it on {state['world_size']}"
            )
        if state["num_workers"] != self.reader.num_workers:
            raise UsageError(
                f"the checkpoint's train stream was read by {state['num_workers']} loader workers and this run's "
                f"train loader has {self.reader.num_workers}: each worker builds batches of its own part of a stream, "
                f"so another number trains other samples; resume with num_workers={state['num_workers']}, or start a "
                "new run"
            )
        self._resume = state

    def __iter__(self) -> Iterator:
        epoch = self.fit_loop.epoch_progress.current.processed
        if epoch != self.epoch:  # (Lightning makes the epoch's iterator twice when it resumes at an epoch's end)
            self._epoch_resume, self._resume = self._resume, None
        resume, self.epoch = self._epoch_resume, epoch
        skip = resume["trained"] if resume is not None and resume["epoch"] == epoch else 0
        self._start(epoch, skip)
        if self.order == "state":
            batches = self._read_with_snapshots(resume)
        elif mosaic.is_streaming_dataset(self.reader.dataset):  # it starts after the trained samples itself
            batches = read_lazily(self.loader)
        else:
            batches = self._skip(read_lazily(self.loader), skip)
        if self.world_size > 1 and _length(self.loader) is None:
            return self._while_every_rank_has_one(batches)
        return batches

    def _start(self, epoch: int, skip: int) -> None:
        """Sets the epoch where the stream has one, `skip` batches trained in it already, and the workers' seeds."""
        loader = self.reader
        if loader.persistent_workers:  # started again: the epoch reaches new workers only
            end_persistent_workers(loader)
        if self.order == "epochs":
            if _litdata_loader(loader):  # its __iter__ counts the epoch up and sets it on the dataset
                loader.current_epoch, loader.restore = epoch, False
            elif webdatasets.reads_webdataset(self.loader):
                webdatasets.set_epoch(self.loader, epoch)
            elif mosaic.is_streaming_dataset(loader.dataset):
                mosaic.start_epoch(loader.dataset, epoch, skip * loader.batch_size * self.world_size)
            else:
                loader.dataset.set_epoch(epoch)
        loader.generator = torch.Generator().manual_seed(seed_of(self.seed, epoch, self.rank))

    def _skip(self, batches: Iterator, count: int) -> Iterator:
        """The epoch's batches after the first `count`, which the checkpoint's weights have trained on; what the
        re-read cost is said once."""
        started = time.perf_counter()
        for done in range(count):
            if next(batches, _END) is _END:
                raise UsageError(
                    f"the train stream's epoch {self.epoch} ended after {done} batches, and the checkpoint was taken "
                    f"after {count}: its order does not repeat (its set_epoch must make the order a function of the "
                    "seed and the epoch alone)"
                )
        if count and self.rank == 0:
            print(f"resumed the train stream at batch {count} of epoch {self.epoch}: re-read the {count} batches "
                  f"before it in {time.perf_counter() - started:.1f} s", file=sys.stderr)  # fmt: skip
        yield from batches

    def _read_with_snapshots(self, resume: dict | None) -> Iterator:
        """The loader's batches, its state taken after each one is read (and at the end), from the checkpoint's
        position on. A checkpoint taken at an earlier epoch's end before the loader had found that epoch's end
        (Lightning stops at a loader's length without asking for more) finishes that epoch first."""
        loader, count = self.loader, 0
        if resume is not None:
            state = resume["loader"][self.rank if len(resume["loader"]) > 1 else 0]
            loader.load_state_dict(state)
            if resume["epoch"] == self.epoch:
                count = resume["trained"]
            elif not state.get("_iterator_finished", False):
                for _ in loader:
                    pass
        batches = iter(loader)
        self._snapshots = {count: loader.state_dict()}
        while True:
            batch = next(batches, _END)
            if batch is _END:
                self._snapshots[count] = loader.state_dict()  # finished: the next epoch starts from here
                return
            count += 1
            # Taken as soon as the batch is read: Lightning may take a checkpoint after training it without reading
            # another (a loader with a length), or after reading one more (without).
            self._snapshots[count] = loader.state_dict()
            self._snapshots.pop(count - 3, None)
            yield batch

    def _while_every_rank_has_one(self, batches: Iterator) -> Iterator:
        """`batches` while every rank still has one: a rank whose part of the stream is longer stops with the others
        (without this it would wait forever in its next step's gradient all-reduce). Each batch's all-reduce runs on
        the CPU (gloo) while the batch before it trains, and a batch is handed on once the ranks have agreed on it:
        the ranks read one batch further ahead, and the GPU is never waited for."""

        def agree(batch) -> tuple[torch.Tensor, torch.distributed.Work]:
            has_one = torch.tensor([batch is not _END], dtype=torch.int32)
            return has_one, torch.distributed.all_reduce(has_one, torch.distributed.ReduceOp.MIN, self.group, True)

        batch = next(batches, _END)
        has_one, agreeing = agree(batch)
        while True:
            agreeing.wait()
            if not has_one.item():
                return
            following = next(batches, _END)
            next_has_one, next_agreeing = agree(following)
            yield batch
            batch, has_one, agreeing = following, next_has_one, next_agreeing


def read_lazily(loader) -> Iterator:
    """`loader`'s batches, its iterator (and its workers) started at the first batch asked for, as MosaicML's
    StreamingDataLoader does: an iterator made and dropped unread starts no workers, which MosaicML's workers would
    wait for in their barriers."""
    yield from loader


def _length(loader: DataLoader) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


def cpu_group() -> "torch.distributed.ProcessGroup":
    """A process group of every rank for small CPU tensors: the default one under gloo, else a new gloo group (so that
    agreeing on equal steps never waits for a GPU). Every rank must call it."""
    if torch.distributed.get_backend() == "gloo":
        return torch.distributed.group.WORLD
    return torch.distributed.new_group(backend="gloo")


def saved_stream(checkpoint: dict) -> dict | None:
    """The state of the ResumableStream a checkpoint was trained with; None when its train loader was no stream."""
    states = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader", [])
    return next((state for state in states if isinstance(state, dict) and KEY in state), None)
