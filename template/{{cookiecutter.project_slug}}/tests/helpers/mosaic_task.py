"""The stream task (helpers/stream_task.py) read from MosaicML Streaming shards, the way its documentation shows: MDS
shards written with `streaming.MDSWriter` in prepare_data, read by a shuffled `StreamingDataset` in its
`StreamingDataLoader` (or torch's DataLoader)."""

from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

from helpers.stream_task import ValidationSplit, sample


def write_mds_shards(folder: Path, samples: int) -> None:
    from streaming import MDSWriter

    if (folder / "index.json").exists():
        return
    columns = {"x": "ndarray:float32", "y": "int", "index": "int"}
    with MDSWriter(out=str(folder), columns=columns, size_limit=8 << 10) as writer:  # ~8 shards of 600 samples
        for index in range(samples):
            row = sample(index)
            writer.write({"x": np.asarray(row["x"], dtype=np.float32), "y": row["y"], "index": index})


class MosaicData(ValidationSplit):
    """MDS shards read by a shuffled StreamingDataset.

    Args:
        folder: where the shards are (written by prepare_data when missing).
        samples: how many.
        loader: "mosaic" (its StreamingDataLoader) or "torch" (a DataLoader).
    """

    kit_options = {"samples": 96}  # the guarantee kit's short runs: 6 batches an epoch

    def __init__(self, folder: str, samples: int = 600, batch_size: int = 16, num_workers: int = 0,
                 loader: str = "mosaic") -> None:  # fmt: skip
        super().__init__()
        self.save_hyperparameters()

    def prepare_data(self) -> None:
        write_mds_shards(Path(self.hparams.folder), self.hparams.samples)

    def train_dataloader(self):
        from streaming import StreamingDataLoader, StreamingDataset

        write_mds_shards(Path(self.hparams.folder), self.hparams.samples)
        dataset = StreamingDataset(local=self.hparams.folder, shuffle=True, shuffle_seed=7,
                                   batch_size=self.hparams.batch_size)  # fmt: skip
        loader = StreamingDataLoader if self.hparams.loader == "mosaic" else DataLoader
        return loader(dataset, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers)
