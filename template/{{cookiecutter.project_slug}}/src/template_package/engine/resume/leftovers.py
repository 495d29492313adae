"""What a stopped run leaves in its checkpoint folders that the fit going on from it must not find there: temporary
files of writes killed half-way, digests whose file a killed removal had removed, and best checkpoints written after
the state the fit starts from. A ModelCheckpoint knows its best checkpoints from the state it resumes
(`best_k_models`): one the stopped run wrote later stays beside the ones the fit writes again (Lightning names a file
whose name is taken `-v1`), so the run directory would hold more than its best `save_top_k`.
Depends on lightning, digests.py and durable.py.
"""

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from .digests import SUFFIX
from .durable import DurableCheckpointIO


def remove_temporaries(folder: Path) -> None:
    """Remove the temporary files and lone digests in `folder` (call it holding the run's lock: no write in flight)."""
    for leftover in folder.glob("*.tmp"):
        leftover.unlink(missing_ok=True)
    for digest in folder.glob(f"*{SUFFIX}"):
        if not digest.with_suffix("").exists():
            digest.unlink(missing_ok=True)


def remove_unknown(
    trainer: L.Trainer, io: DurableCheckpointIO, run: Path, kept: list[Path], since: float | None
) -> dict[Path, list[str]]:
    """Remove the checkpoints that `io` wrote into the folders of the trainer's ModelCheckpoints inside the run
    directory `run`, which none of them knows of, nor are `kept`, and whose state was taken after `since` (None: at any
    time, a fresh start), by their digests (digests.py: the same process's clock as `since`, to the microsecond; a
    file's or an object's own time may be a clock tick or a whole second off). Returns the names removed, by folder. A
    folder outside the run directory may be shared with other runs: left alone."""
    keepers = [callback for callback in trainer.checkpoint_callbacks if isinstance(callback, ModelCheckpoint)]
    known = {Path(path).resolve() for path in kept} | {
        Path(path).resolve()
        for keeper in keepers
        for path in (*keeper.best_k_models, keeper.best_model_path, keeper.kth_best_model_path, keeper.last_model_path)
        if path
    }
    removed = {}
    for folder in sorted({Path(keeper.dirpath).resolve() for keeper in keepers if keeper.dirpath}):
        if not folder.is_relative_to(run.resolve()):
            continue
        stale = sorted(path for path, taken in io.checkpoints_in(folder).items()
                       if path.resolve() not in known and (since is None or taken > since))  # fmt: skip
        for path in stale:
            io.remove_checkpoint(path)
        if stale:
            removed[folder] = [path.name for path in stale]
    return removed
