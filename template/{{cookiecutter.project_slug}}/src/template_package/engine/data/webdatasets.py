"""WebDataset pipelines read as streams that resume exactly (streams.ResumableStream re-reads the epoch and skips
what was trained): the engine reads a pipeline's stages to know whether its order repeats, and gives the stages that
count epochs the run's epoch.

What repeats, in webdataset 1.x: `shardshuffle=N, seed=S` and `.shuffle(n, seed=S)` rebuild `random.Random(S)` at
every iteration, so every epoch has the same order; `detshuffle=True` and `ResampledShards(..., deterministic=True)`
count the iterations of each process's copy, not the training's epochs, so the engine sets their epoch before each
one. What does not: an unseeded `.shuffle(n)` seeds itself from the process ID and the time, `resampled=True` from
those and `os.urandom`, and a `.shuffle(n, rng=...)` goes on from its generator's state.

A `wds.WebLoader` is a pipeline whose first stage is a DataLoader and whose later stages (`.unbatched().shuffle(n)
.batched(b)`) run in the training process; its DataLoader reads the dataset pipeline, in workers or not.

Depends on torch; on webdataset only for a loader that uses it.
"""

import sys

from torch.utils.data import DataLoader


def is_pipeline(obj: object) -> bool:
    wds = sys.modules.get("webdataset")  # (a pipeline exists only once webdataset is imported)
    return wds is not None and isinstance(obj, wds.DataPipeline)


def is_web_loader(loader: object) -> bool:
    """A `wds.WebLoader`: a pipeline that starts with a DataLoader."""
    return is_pipeline(loader) and bool(loader.pipeline) and isinstance(loader.pipeline[0], DataLoader)


def inner_loader(loader) -> DataLoader:
    """The DataLoader that reads the dataset: a WebLoader's first stage, or `loader` itself."""
    return loader.pipeline[0] if is_web_loader(loader) else loader


def stages(loader) -> list:
    """Every stage of the pipelines `loader` runs: the dataset's, then a WebLoader's own."""
    inner = inner_loader(loader)
    found = list(inner.dataset.pipeline) if is_pipeline(inner.dataset) else []
    return found + (list(loader.pipeline[1:]) if inner is not loader else [])


def reads_webdataset(loader) -> bool:
    return is_web_loader(loader) or (isinstance(loader, DataLoader) and is_pipeline(loader.dataset))


def _counts_epochs(stage) -> bool:
    wds = sys.modules["webdataset"]
    return isinstance(stage, wds.filters.detshuffle) or (
        isinstance(stage, wds.shardlists.ResampledShards) and stage.deterministic
    )


def why_it_does_not_repeat(loader) -> str | None:
    """The first stage whose order does not repeat from one run to the next, named with its fix; None when all do."""
    wds = sys.modules["webdataset"]
    for stage in stages(loader):
        if isinstance(stage, wds.shardlists.ResampledShards) and not stage.deterministic:
            return (
                "its ResampledShards stage (resampled=True) seeds itself from the process ID, the time and "
                "os.urandom, so the run does not repeat, and a run resumed mid-epoch reads that epoch again from its "
                "start: use wds.ResampledShards(urls, deterministic=True)"
            )
        if isinstance(stage, wds.filters.FilterFunction) and stage.f.__name__ == "_shuffle":
            size = stage.args[0] if stage.args else stage.kw.get("bufsize", 1000)
            if "rng" in stage.kw:
                return (
                    f"its shuffle({size}) stage draws from a generator it was given (rng=), which goes on from "
                    f"epoch to epoch, so a resumed run draws other numbers: give it seed= instead"
                )
            if stage.kw.get("seed") is None:
                return (
                    f"its shuffle({size}) stage is unseeded: it seeds itself from the process ID and the time, so "
                    f"the run does not repeat, and a run resumed mid-epoch reads that epoch again from its start: "
                    f"give it a seed (.shuffle({size}, seed=...))"
                )
    return None


def set_epoch(loader, epoch: int) -> None:
    """Gives the stages that count their iterations (detshuffle, deterministic ResampledShards) the run's epoch:
    each adds one before it draws."""
    for stage in stages(loader):
        if _counts_epochs(stage):
            stage.epoch = epoch - 1
