"""MosaicML Streaming's `StreamingDataset` read as a stream that resumes exactly, with the library's own resume.

Its order is a function of its shuffle seed, the epoch and its canonical nodes, the same with any number of loader
workers; it keeps the epoch in shared memory and counts it up at each pass. Before each epoch the engine tells it the
run's epoch and the samples the checkpoint trained (across every process), which it skips without reading them. Its
`StreamingDataLoader` counts the batches handed out, not those trained, and its `state_dict` takes arguments a
StatefulDataLoader does not give: neither is used.

Depends on mosaicml-streaming only for a loader that reads it.
"""

import sys


def is_streaming_dataset(dataset: object) -> bool:
    streaming = sys.modules.get("streaming")  # (a StreamingDataset exists only once streaming is imported)
    return streaming is not None and isinstance(dataset, streaming.StreamingDataset)


def start_epoch(dataset, epoch: int, samples_done: int) -> None:
    """Makes `dataset` read `epoch` from its sample `samples_done` on (counted over every process)."""
    layout = dataset.state_dict(num_samples=0, from_beginning=True)  # its canonical nodes and seed
    dataset.next_epoch = epoch
    dataset.load_state_dict({**layout, "epoch": epoch, "sample_in_epoch": samples_done})
