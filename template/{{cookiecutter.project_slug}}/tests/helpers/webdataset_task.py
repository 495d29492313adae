"""The stream task (helpers/stream_task.py) read from WebDataset tar shards, the way its documentation shows: shards
written with `wds.ShardWriter` in prepare_data, read by `wds.WebDataset(...).shuffle(...).decode()` in a DataLoader,
or in a `wds.WebLoader` whose own stages reshuffle across the workers' batches in the training process."""

from pathlib import Path

import torch
from torch.utils.data import DataLoader, default_collate

from helpers.stream_task import ValidationSplit, sample


def write_tar_shards(folder: Path, samples: int, shards: int) -> str:
    """`samples` stream-task samples in `shards` tar files; returns their brace pattern."""
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    pattern = str(folder / "shard-%06d.tar")
    if not (folder / f"shard-{shards - 1:06d}.tar").exists():
        with wds.ShardWriter(pattern, maxcount=samples // shards, verbose=0) as writer:
            for index in range(samples):
                row = sample(index)
                writer.write({"__key__": f"{index:06d}", "x.npy": row["x"], "y.cls": row["y"], "index.cls": index})
    return str(folder / "shard-{}{:06d}..{:06d}{}.tar".format("{", 0, shards - 1, "}"))  # (braces: no Jinja here)


def as_dict(row: tuple) -> dict:
    x, y, index = row
    return {"x": torch.as_tensor(x), "y": torch.as_tensor(y), "index": torch.as_tensor(index)}


def to_dict(batch: list) -> dict:
    return dict(zip(("x", "y", "index"), batch, strict=True))


class WebDatasetData(ValidationSplit):
    """Tar shards read by WebDataset with a shard shuffle and a sample shuffle.

    Args:
        folder: where the shards are (written by prepare_data when missing).
        samples, shards: how many.
        loader: "dataloader" (torch's, batching in the workers) or "webloader" (`wds.WebLoader`: batches of 8 from the
            workers, unbatched, reshuffled and batched again in the training process).
        seeded: seed every shuffle (seed=); unseeded, the sample shuffle seeds itself from the PID and the time.
        detshuffle: the shard shuffle by epoch (detshuffle=True).
        resampled: shards drawn with replacement (resampled=True).
    """

    kit_options = {"samples": 96}  # the guarantee kit's short runs: 6 batches an epoch

    def __init__(self, folder: str, samples: int = 600, shards: int = 8, batch_size: int = 16, num_workers: int = 0,
                 loader: str = "dataloader", seeded: bool = True, detshuffle: bool = False,
                 resampled: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()

    def prepare_data(self) -> None:
        write_tar_shards(Path(self.hparams.folder), self.hparams.samples, self.hparams.shards)

    def train_dataloader(self):
        import webdataset as wds

        settings = self.hparams
        urls = write_tar_shards(Path(settings.folder), settings.samples, settings.shards)
        seed = {"seed": 11} if settings.seeded else {}
        dataset = wds.WebDataset(urls, shardshuffle=4, detshuffle=settings.detshuffle, resampled=settings.resampled,
                                 nodesplitter=wds.split_by_node, seed=5)  # fmt: skip
        dataset = dataset.shuffle(50, **seed).decode().to_tuple("x.npy", "y.cls", "index.cls")
        if settings.resampled:
            dataset = dataset.with_epoch(settings.samples // max(1, settings.num_workers))
        if settings.loader == "dataloader":
            return DataLoader(dataset.map(as_dict), batch_size=settings.batch_size, num_workers=settings.num_workers)
        loader = wds.WebLoader(dataset.batched(8, collation_fn=default_collate), batch_size=None,
                               num_workers=settings.num_workers)  # fmt: skip
        return (
            loader.unbatched()
            .shuffle(100, **seed)
            .batched(settings.batch_size, collation_fn=default_collate)
            .map(to_dict)
        )
