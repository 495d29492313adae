"""Train loaders that resume exactly, whatever dataset they read: the engine rebuilds the one a DataModule (or
module) returns, the way Lightning rebuilds loaders with a DistributedSampler under DDP.

A map-style train loader, `DataLoader(dataset, shuffle=True)` or torchdata's `StatefulDataLoader(dataset,
shuffle=True)` (or `shuffle=False`), becomes a `StatefulDataLoader` over the same dataset with the same batch size,
workers, collate function and pinning, whose order is an `EpochShuffleSampler` (a function of seed and epoch), whose
position Lightning saves in every checkpoint, and whose samples are read through `SeededSamples` (random draws per
(seed, epoch, index)). Plain torch's loader saves no position; torchdata's RandomSampler is inexact when a run resumes
at an epoch boundary. A sampler or batch sampler of the user's own is drawn once an epoch from (seed, epoch) by a
`DrawnOrderSampler` (drawn_order.py) and read the same way. A TensorDataset is gathered a batch at a time (one index
operation instead of a `__getitem__` and a stack per sample).

With drop_last, an epoch is whole global batches (the samples of one optimizer step on every process), and a run
may go on on another number of processes (training/batch_layout.py); a checkpoint without a layout records why.
Validation loaders without a generator get one of their own (see ResumableLoaders). A streaming train loader (an
iterable dataset, a WebDataset WebLoader) is streams.py's: the engine makes it exact when it can know that the
stream's order repeats, and otherwise gives one notice, on rank 0, before the first training batch.
Depends on torch, torchdata, lightning, sampling.py, drawn_order.py and streams.py, and the engine's
training/batch_layout.py and errors.py.
"""

import sys

import lightning as L
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    default_collate,
)
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader import sampler as torchdata_samplers

from ..errors import UsageError
from ..internals import num_samples_given
from ..training.batch_layout import KEY as LAYOUT
from ..training.batch_layout import NO_LAYOUT, BatchLayout, move_progress, saved_layout
from . import streams
from .drawn_order import KEY as DRAWN
from .drawn_order import DrawnOrderSampler
from .sampling import EpochShuffleSampler, SeededSamples, reads_batches

# The samplers a DataLoader or StatefulDataLoader makes itself from batch_size and shuffle: torch's and torchdata's.
SHUFFLED = (RandomSampler, torchdata_samplers.RandomSampler)
BATCHING = (BatchSampler, torchdata_samplers.BatchSampler)

SEED = "train_loader_seed"  # in a checkpoint: the seed the train loader's order and draws follow
REMEDY = "read a map-style dataset in DataLoader(dataset, shuffle=True) or StatefulDataLoader (docs/data.md)"


def why_not_resumable(loader) -> str | None:
    """Why the engine cannot make `loader` resume exactly, or None when it can (or it already does)."""
    if streams.is_stream(loader):
        return streams.why_not_exact(loader)
    if not isinstance(loader, DataLoader):
        return f"it is a {type(loader).__name__}, not a DataLoader"
    return None


def own_batch_sampler(loader: DataLoader) -> bool:
    """Whether `loader` draws its batches with a batch sampler of its own (not one it made from batch_size)."""
    batches = loader.batch_sampler
    return batches is not None and (type(batches) not in BATCHING or batches.sampler is not loader.sampler)


def shuffles_itself(sampler) -> bool:
    """Whether `sampler` is one the engine replaces by its own shuffle: a loader's `shuffle=True` or `False`."""
    if type(sampler) in SHUFFLED:
        return not (sampler.replacement or num_samples_given(sampler))
    return type(sampler) is SequentialSampler


def why_no_layout(loader: DataLoader) -> str | None:
    """Why the engine cannot lay out a resumable `loader`'s epochs in whole global batches (training/batch_layout.py),
    which a run needs to go on on another number of processes; None when it can."""
    if isinstance(loader.dataset, IterableDataset):
        return "it reads an iterable dataset"
    if isinstance(loader.sampler, EpochShuffleSampler):
        return "it has an EpochShuffleSampler of its own, whose batches the engine leaves as they are"
    if own_batch_sampler(loader):
        return (
            f"it draws batches with a batch sampler of its own ({type(loader.batch_sampler).__name__}), whose batches "
            "the engine cannot regroup into the same global batches"
        )
    if loader.batch_size is None or not loader.drop_last:
        return "it keeps a partial last batch (drop_last=False), a global batch of another size"
    return None


def resumable_loader(
    loader: DataLoader,
    seed: int,
    epoch: int,
    num_replicas: int = 1,
    rank: int = 0,
    batch_size: int | None = None,
    global_batch: int | None = None,
) -> DataLoader:
    """`loader` rebuilt to resume exactly (see the module docstring), starting at `epoch`'s order; returned as it is
    when it already resumes exactly or cannot be rebuilt (why_not_resumable). `batch_size`: another batch size than
    the loader's; `global_batch`: epochs of whole global batches (EpochShuffleSampler), with drop_last only."""
    if why_not_resumable(loader) is not None or isinstance(loader.dataset, IterableDataset):
        return loader
    if isinstance(loader.sampler, EpochShuffleSampler):
        loader.sampler.set_epoch(epoch)
        return loader
    dataset, drop_last, batches = loader.dataset, loader.drop_last, own_batch_sampler(loader)
    batch_size = batch_size or loader.batch_size
    global_batch = global_batch if drop_last else None

    def order(batch_size: int | None, with_epoch: bool) -> EpochShuffleSampler:
        if batches or not shuffles_itself(loader.sampler):  # the user's sampler, drawn from (seed, epoch)
            source = loader.batch_sampler if batches else loader.sampler
            return DrawnOrderSampler(source, seed, batch_size, num_replicas, rank, with_epoch, drop_last, global_batch,
                                     batches=batches)  # fmt: skip
        return EpochShuffleSampler(len(dataset), seed, batch_size, num_replicas, rank, with_epoch,
                                   type(loader.sampler) in SHUFFLED, drop_last, global_batch)  # fmt: skip

    tensors = isinstance(dataset, TensorDataset) and loader.collate_fn is default_collate and not batches
    if tensors and batch_size is not None:  # the sampler yields index lists; the dataset gathers each batch at once
        sampler = order(batch_size, with_epoch=False)
        batch_size, drop_last, collate = None, False, None
    else:
        seeded = not tensors  # (a TensorDataset draws no random numbers)
        sampler = order(None, with_epoch=seeded)
        dataset, collate = (SeededSamples(dataset, seed) if seeded else dataset), loader.collate_fn
    sampler.set_epoch(epoch)
    workers = loader.num_workers
    return StatefulDataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=loader.pin_memory,
        drop_last=drop_last,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        # Worker seeds are drawn from this generator, not from the global one the model's dropout uses.
        generator=torch.Generator().manual_seed(seed),
        prefetch_factor=loader.prefetch_factor if workers else None,
        persistent_workers=loader.persistent_workers if workers else False,
        pin_memory_device=loader.pin_memory_device,
    )


class ResumableLoaders:
    """Makes the run's train loader resume exactly (`resumable_loader`), or says once why it cannot; and gives each
    validation loader without a generator one of its own. (A loader draws its workers' seed when its iterator is
    made: from the global generator, without one. With persistent workers a run that never stopped draws it in the
    sanity check, which Lightning isolates, and a resumed run, which skips the sanity check, at its first validation:
    its random draws then differed from there on.) A part of resume/exact_resume.py's ExactResume, which calls these
    from its hooks; it wraps the loader methods of the DataModule, or else of the module.

    A train loader with drop_last reads epochs of whole global batches (training/batch_layout.py), and each checkpoint
    records its layout: a run resumed on the same number of processes goes on with it, and with `world_size_may_change`
    (`fit --allow_change world_size`) one resumed on another number goes on with the same global batch, reading on
    from the global position where it stopped.

    A streaming train loader becomes a `streams.ResumableStream`, which is given the stream's state from the resumed
    checkpoint here (Lightning loads loader states only when it resumes inside an epoch).

    The order and per-sample draws follow the run's seed (torch's initial seed, which seed_everything sets); a resumed
    run takes the seed its checkpoint records, so that a run that was never seeded reads on as it would have."""

    def __init__(self, world_size_may_change: bool = False) -> None:
        self.world_size_may_change = world_size_may_change
        self.layout: BatchLayout | None = None  # the train loader's, None when it keeps a partial last batch
        self._saved: BatchLayout | None = None  # the resumed checkpoint's
        self._resume_at: tuple[int, int] | None = None  # (epoch, global position) after a move to another world size
        self._stream_state: dict | None = None  # the resumed checkpoint's, for a streaming train loader
        self._group = None  # streams.cpu_group(), made once, under several processes
        self._noticed = False
        self._said = False  # what replaced the user's train loader, said once a run
        self._drawn: tuple[DrawnOrderSampler, int] | None = None  # the train loader's, with its positions a batch
        self._drawn_record: dict | None = None  # the resumed checkpoint's DrawnOrderSampler.record
        self._no_layout: str | None = None  # why_no_layout of the train loader
        self._loader_states: list | None = None  # the resumed checkpoint's loader states, which Lightning loads
        self._batches_done: tuple[int, int] | None = None  # (epoch, its batches trained) of a mid-epoch checkpoint
        self._seed: int | None = None  # the resumed checkpoint's seed

    @property
    def seed(self) -> int:
        """The run's seed: the resumed checkpoint's, else torch's initial seed (seed_everything's)."""
        return self._seed if self._seed is not None else torch.initial_seed()

    def save(self, trainer: L.Trainer, checkpoint: dict) -> None:
        checkpoint[SEED] = self.seed
        if self.layout is not None:
            checkpoint[LAYOUT] = self.layout.state()
        elif self._no_layout is not None:
            checkpoint[NO_LAYOUT] = self._no_layout
        if self._drawn is not None:
            sampler, per_batch = self._drawn
            trained = trainer.fit_loop.epoch_loop.batch_progress.current.processed
            checkpoint[DRAWN] = sampler.record(trained * per_batch * trainer.world_size)

    def load(self, trainer: L.Trainer, checkpoint: dict) -> None:
        """Before Lightning restores the loops: on another number of processes, their batch counts are rewritten
        for the new layout (batch_layout.move_progress)."""
        self._saved, self._resume_at = saved_layout(checkpoint), None
        self._drawn_record, self._seed = checkpoint.get(DRAWN), checkpoint.get(SEED)
        loop = checkpoint.get("loops", {}).get("fit_loop", {})
        self._loader_states = loop.get("state_dict", {}).get("combined_loader")  # (Lightning loads this list later)
        self._batches_done = resumed_batches(loop)
        # (Lightning loads the loader states only when it resumes inside an epoch; a stream needs its state at an
        # epoch's end too.)
        self._stream_state = streams.saved_stream(checkpoint)
        if trainer.state.fn != "fit" or self._saved is None or self._saved.world_size == trainer.world_size:
            return  # (validate, test and predict read no train loader: any number of processes evaluates it)
        if not self.world_size_may_change:
            raise UsageError(
                f"the checkpoint was saved by {self._saved.world_size} processes and this run has "
                f"{trainer.world_size}: resume it on {self._saved.world_size}, or with --allow_change world_size "
                "(ExactResume's world_size_may_change = True in a Trainer of your own)"
            )
        self._loader_states = self._batches_done = None  # (the move reads on from the global position itself)
        self._resume_at = move_progress(checkpoint, self._saved, self._saved.on(trainer.world_size))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """When a fit sets up: wrap the owner's loader methods."""
        owner = trainer.datamodule if trainer.datamodule is not None else pl_module
        if "train_dataloader" in vars(owner) or not is_overridden("train_dataloader", owner):
            return  # wrapped by an earlier fit of the same objects, or no loader of its own
        build, build_val = owner.train_dataloader, owner.val_dataloader

        def val_dataloader():
            loaders = build_val()
            for loader in loaders if isinstance(loaders, list | tuple) else [loaders]:
                if isinstance(loader, DataLoader) and loader.generator is None:
                    loader.generator = torch.Generator().manual_seed(self.seed)
            return loaders

        def train_dataloader():
            loader = build()
            rebuilt = self._train_loader(trainer, loader)
            if rebuilt is not loader and not self._said and trainer.is_global_zero:
                print(f"engine: {what_replaced(loader, rebuilt)}, to resume exactly (docs/models-and-data.md)",
                      file=sys.stderr)  # fmt: skip
                self._said = True
            return rebuilt

        owner.train_dataloader = train_dataloader
        if is_overridden("val_dataloader", owner):
            owner.val_dataloader = val_dataloader

    def _train_loader(self, trainer: L.Trainer, loader) -> DataLoader:
        seed, epoch = self.seed, trainer.fit_loop.epoch_progress.current.processed
        world_size, rank = trainer.world_size, trainer.global_rank
        reason = why_not_resumable(loader)
        if reason is not None:
            self._notice(trainer, reason, streams.remedy(loader) if streams.is_stream(loader) else REMEDY)
        if streams.is_stream(loader):
            self.layout = None
            if reason is not None:
                return loader
            if world_size > 1 and self._group is None:
                self._group = streams.cpu_group()
            loader = streams.prepared(loader, rank, world_size)
            stream = streams.ResumableStream(loader, seed, trainer.fit_loop, rank, world_size, self._group)
            if self._stream_state is not None:
                stream.load_state_dict(self._stream_state)
                self._stream_state = None
            return stream
        reason = self._no_layout = reason or why_no_layout(loader)
        self.layout = None
        if reason is not None:
            if self._resume_at is not None:
                raise UsageError(f"the train loader cannot go on on another number of processes: {reason}")
            rebuilt = resumable_loader(loader, seed, epoch, world_size, rank)
            return self._checked_against_the_checkpoint(trainer, rebuilt)
        asked = (loader.batch_size, trainer.accumulate_grad_batches)
        self.layout = BatchLayout(world_size, *asked, asked)
        if self._saved is not None and self._saved.asked == asked:  # the run's own layout, on this world size
            self.layout = self._saved.on(world_size)
        elif self._resume_at is not None:
            raise UsageError(
                "a run resumed on another number of processes keeps its global batch: leave the batch size and "
                "trainer.accumulate_grad_batches as they were"
            )
        trainer.accumulate_grad_batches = self.layout.accumulate
        rebuilt = resumable_loader(loader, seed, epoch, world_size, rank, batch_size=self.layout.batch_size,
                                   global_batch=self.layout.global_batch)  # fmt: skip
        if self._resume_at is not None:
            rebuilt.sampler.resume_at(*self._resume_at)
            self._resume_at = None
            if reads_batches(loader.dataset) and trainer.is_global_zero:
                print(f"notice: this run moved from {self._saved.world_size} to {world_size} processes and goes on "
                      f"inexactly: its train dataset ({type(loader.dataset).__name__}) reads a batch at a time, its "
                      "random draws seeded per batch, and another number of processes batches other samples, so "
                      "from here it differs from the run that never moved", file=sys.stderr)  # fmt: skip
        return self._checked_against_the_checkpoint(trainer, rebuilt)

    def _workers_changed(self, trainer: L.Trainer, loader: DataLoader) -> None:
        """A mid-epoch resume with another number of loader workers (a loading option): torchdata's state of one
        number cannot be loaded into a loader of another, so it is dropped and the engine's sampler reads on from the
        global position trained instead; each sample's draws are seeded per sample, so the run is the same."""
        states, done = self._loader_states, self._batches_done
        if not states or done is None or len(states) != 1 or not isinstance(loader.sampler, EpochShuffleSampler):
            return
        saved = states[0].get("_snapshot", {}).get("_main_snapshot", {}).get("_num_workers", 0)  # (torchdata's)
        if saved == loader.num_workers:
            return
        sampler = loader.sampler
        per_batch = 1 if getattr(sampler, "batches", False) else sampler.batch_size or loader.batch_size
        states.clear()
        sampler.resume_at(done[0], done[1] * per_batch * trainer.world_size)

    def _checked_against_the_checkpoint(self, trainer: L.Trainer, loader: DataLoader) -> DataLoader:
        """After a resume, fits the loader to what the checkpoint saved: its reading position when the number of
        workers changed, and a DrawnOrderSampler's epoch drawn again (a notice when its positions differ: the order is
        not a function of the seed and the epoch). Keeps the DrawnOrderSampler for the checkpoints."""
        if self._resume_at is None:
            self._workers_changed(trainer, loader)
        self._loader_states = self._batches_done = None
        sampler = loader.sampler
        if not isinstance(sampler, DrawnOrderSampler):
            self._drawn = None
            return loader
        self._drawn = sampler, 1 if sampler.batches else sampler.batch_size or loader.batch_size
        record, self._drawn_record = self._drawn_record, None
        if record is not None and not sampler.matches(record) and trainer.is_global_zero:
            name = type(sampler.source).__name__
            print(f"notice: the train loader's {name} drew another order for epoch {record['epoch']} than the run that "
                  f"was stopped: its order is not a function of the seed and the epoch, so the resumed run reads other "
                  f"samples. Draw from torch's generators (the sampler's attribute `generator`, as torch's samplers "
                  f"take one, or the global generator), or make its order follow from set_epoch(epoch)",
                  file=sys.stderr)  # fmt: skip
        return loader

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        owner = trainer.datamodule if trainer.datamodule is not None else pl_module
        vars(owner).pop("train_dataloader", None)
        vars(owner).pop("val_dataloader", None)

    def _notice(self, trainer: L.Trainer, reason: str, remedy: str) -> None:
        if trainer.is_global_zero and not self._noticed:
            print(f"notice: the train loader cannot resume exactly: {reason}; a run resumed from a checkpoint then "
                  f"reads other samples than the run that never stopped. To resume exactly, {remedy}",
                  file=sys.stderr)  # fmt: skip
            self._noticed = True


def what_replaced(loader: DataLoader, rebuilt) -> str:
    """The user's train loader and what the engine reads instead, named: `DataLoader(RandomSampler) is read as
    StatefulDataLoader(EpochShuffleSampler) over SeededSamples`."""
    if not isinstance(rebuilt, DataLoader):  # (a stream)
        return f"the train loader {type(loader).__name__} is read through {type(rebuilt).__name__}"
    sampler = loader.batch_sampler if own_batch_sampler(loader) else loader.sampler
    seeded = (
        " over SeededSamples (random draws seeded per sample)" if isinstance(rebuilt.dataset, SeededSamples) else ""
    )
    return (f"the train loader {type(loader).__name__}({type(sampler).__name__}) is read as "
            f"{type(rebuilt).__name__}({type(rebuilt.sampler).__name__}){seeded}")  # fmt: skip


def resumed_batches(loop: dict) -> tuple[int, int] | None:
    """(epoch, batches trained in it) of a checkpoint's fit loop taken inside an epoch; None at an epoch's end."""
    if not loop:
        return None
    epochs, batches = loop["epoch_progress"]["current"], loop["epoch_loop.batch_progress"]["current"]
    return (epochs["processed"], batches["ready"]) if epochs["started"] > epochs["processed"] else None
