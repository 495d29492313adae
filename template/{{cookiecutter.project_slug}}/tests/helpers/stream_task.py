"""A task that reads its training data as a stream, the way a new user would write one (tests/test_streaming.py): a
plain LightningModule with dropout and dict batches, and DataModules that read locally generated files with Hugging
Face `datasets` streaming (JSON lines shards) or litdata (chunks built by `litdata.optimize` in `prepare_data`), as
those libraries' documentation shows, and iterables of the user's own.

Every sample is a dict {"x": 16 floats, "y": a class of 3, "index": its index}, the same function of the index in
every source, so that a test can tell which samples a step trained on.
"""

import json
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from template_package.engine import TrainingRecipe

FEATURES, CLASSES = 16, 3


def sample(index: int) -> dict:
    """Sample `index`: features drawn from a generator of its own, the class a fixed linear function of them."""
    x = np.random.default_rng(index).normal(size=FEATURES).astype(np.float32)
    return {"x": x, "y": int(np.argmax(x[:CLASSES] + x[CLASSES : 2 * CLASSES])), "index": index}


def write_json_shards(folder: Path, sizes: list[int]) -> list[str]:
    """JSON lines shards of `sizes` samples each, numbered on from one shard to the next; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, start = [], 0
    for number, size in enumerate(sizes):
        path = folder / f"shard-{number}.jsonl"
        if not path.exists():
            rows = [sample(i) for i in range(start, start + size)]
            path.write_text("".join(json.dumps({**row, "x": row["x"].tolist()}) + "\n" for row in rows))
        paths.append(str(path))
        start += size
    return paths


class StreamModel(L.LightningModule):
    """A small MLP with dropout on dict batches, SGD with momentum, train/loss logged at every step."""

    def __init__(self, lr: float = 0.05, dropout: float = 0.3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, CLASSES))

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss = F.cross_entropy(self.net(batch["x"]), batch["y"])
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.log("val/loss", F.cross_entropy(self.net(batch["x"]), batch["y"]), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class RecipeStreamModel(TrainingRecipe):
    """StreamModel's network on the engine's recipe: AdamW and the warmup-cosine schedule, whose length a stream
    cannot give (it has none): the run's trainer.max_steps gives it."""

    def __init__(self, dropout: float = 0.3, **recipe) -> None:
        super().__init__(**recipe)
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, CLASSES))

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        return F.cross_entropy(self.net(batch["x"]), batch["y"])

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.log("val/loss", F.cross_entropy(self.net(batch["x"]), batch["y"]), sync_dist=True)


class ValidationSplit(L.LightningDataModule):
    """A small map-style validation split, one batch of samples 100,000 on, for the stream DataModules below."""

    def val_dataloader(self) -> DataLoader:
        return DataLoader([sample(100_000 + i) for i in range(32)], batch_size=32)


class HFStreamData(ValidationSplit):
    """JSON lines shards read with `load_dataset("json", streaming=True)`, shuffled with a seeded buffer, in a
    StatefulDataLoader (or a plain DataLoader): what `datasets`' documentation shows for streaming.

    Args:
        folder: where the shards are (written by prepare_data when missing).
        shard_sizes: the samples of each shard.
        buffer_size: the shuffle buffer; 0: no shuffle.
        split_by_rank: split the stream between processes here (the engine does it otherwise).
    """

    kit_options = {"shard_sizes": [24, 24, 24, 24]}  # the guarantee kit's short runs: 6 batches an epoch

    def __init__(self, folder: str, shard_sizes: tuple[int, ...] = (150, 150, 150, 150), batch_size: int = 16,
                 num_workers: int = 0, buffer_size: int = 100, stateful: bool = True,
                 split_by_rank: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()

    def prepare_data(self) -> None:
        write_json_shards(Path(self.hparams.folder), list(self.hparams.shard_sizes))

    def train_dataloader(self) -> DataLoader:
        from datasets import load_dataset

        files = write_json_shards(Path(self.hparams.folder), list(self.hparams.shard_sizes))
        stream = load_dataset("json", data_files=files, split="train", streaming=True)
        if self.hparams.buffer_size:
            stream = stream.shuffle(seed=5, buffer_size=self.hparams.buffer_size)
        if self.hparams.split_by_rank and self.trainer.world_size > 1:
            from datasets.distributed import split_dataset_by_node

            stream = split_dataset_by_node(stream, rank=self.trainer.global_rank, world_size=self.trainer.world_size)
        loader = StatefulDataLoader if self.hparams.stateful else DataLoader
        return loader(stream.with_format("torch"), batch_size=self.hparams.batch_size,
                      num_workers=self.hparams.num_workers)  # fmt: skip


def make_sample(index: int) -> dict:
    return sample(index)


class LitStreamData(ValidationSplit):
    """Chunks built by `litdata.optimize` in prepare_data, read by litdata's StreamingDataset (shuffle=True) in its
    StreamingDataLoader: what litdata's documentation shows.

    Args:
        folder: where the chunks are (built by prepare_data when missing).
        samples: how many.
    """

    def __init__(self, folder: str, samples: int = 600, batch_size: int = 16, num_workers: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()

    def prepare_data(self) -> None:
        import litdata

        if not (Path(self.hparams.folder) / "index.json").exists():
            litdata.optimize(fn=make_sample, inputs=list(range(self.hparams.samples)), output_dir=self.hparams.folder,
                             chunk_bytes="8KB", num_workers=1, verbose=False)  # fmt: skip

    def train_dataloader(self):
        import litdata

        dataset = litdata.StreamingDataset(self.hparams.folder, shuffle=True, seed=3)
        return litdata.StreamingDataLoader(dataset, batch_size=self.hparams.batch_size,
                                           num_workers=self.hparams.num_workers)  # fmt: skip


class HeldOrder(IterableDataset):
    """Samples 0..n-1 in an order drawn each epoch from a generator the dataset holds, with a state of its own
    (`state_dict`/`load_state_dict`: the generator at the epoch's start and the position) and no `set_epoch`. Each of
    `world_size` processes reads its own part, shuffled by a generator of its own."""

    def __init__(self, n: int, rank: int = 0, world_size: int = 1) -> None:
        self.samples = list(range(rank, n, world_size))
        self.generator, self.position, self.epoch_start = torch.Generator().manual_seed(7 + rank), 0, None

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.position == 0:
            self.epoch_start = self.generator.get_state()
        generator = torch.Generator()
        generator.set_state(self.epoch_start)
        order = torch.randperm(len(self.samples), generator=generator).tolist()
        mine = [self.samples[i] for i in order[worker::workers]]
        if self.position == 0:
            torch.randperm(len(self.samples), generator=self.generator)  # the next epoch's order comes from here
        while self.position < len(mine):
            self.position += 1
            yield sample(mine[self.position - 1])
        self.position = 0

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "position": self.position, "epoch_start": self.epoch_start}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.position, self.epoch_start = state["position"], state["epoch_start"]


class UnseededDraws(IterableDataset):
    """Samples drawn at random with nothing that makes the draws repeat: no state, no set_epoch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return (sample(int(i)) for i in np.random.default_rng().integers(0, 10_000, self.n))


class IterableData(ValidationSplit):
    """A stream of the user's own: `kind` "held" (HeldOrder) or "unseeded" (UnseededDraws), in a DataLoader."""

    def __init__(self, kind: str = "held", samples: int = 600, batch_size: int = 16, num_workers: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self) -> DataLoader:
        if self.hparams.kind == "held":
            dataset = HeldOrder(self.hparams.samples, self.trainer.global_rank, self.trainer.world_size)
        else:
            dataset = UnseededDraws(self.hparams.samples)
        return DataLoader(dataset, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)


class RecordIndices(L.Callback):
    """Appends "<global step> <epoch> <rank>: <the batch's sample indices>" to `path` after each training batch."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        with self.path.open("a") as records:
            records.write(f"{trainer.global_step} {trainer.current_epoch} {trainer.global_rank}: "
                          f"{batch['index'].tolist()}\n")  # fmt: skip


class PositionAheadOfTheWeights(L.Callback):
    """Switches the engine's position fix off in this process (a negative control): each checkpoint records one batch
    more than the weights have trained on, as the loader's own state did while Lightning had read a batch ahead."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from template_package.engine.data.streams import ResumableStream

        position = ResumableStream.state_dict

        def ahead(stream: ResumableStream) -> dict:
            state = position(stream)
            return {**state, "trained": state["trained"] + 1} if state else state

        ResumableStream.state_dict = ahead
