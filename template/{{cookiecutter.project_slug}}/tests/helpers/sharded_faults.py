"""Test-only faults inside a sharded save (test_sharded.py): the engine's ShardedStrategy whose storage writer, on one
rank, for the first save of a step >= `step`, fails or stalls after writing half of its file. Given to a run with
`--trainer.strategy helpers.sharded_faults.FaultyShardedStrategy --trainer.strategy.fault ...`."""

import errno
import os
import signal
import time
from pathlib import Path

from lightning.fabric.strategies.launchers import subprocess_script
from torch.distributed.checkpoint import FileSystemWriter

from template_package.engine.training.sharding import ShardedStrategy


class FaultyShardedStrategy(ShardedStrategy):
    """`fault`: "EIO" (an OSError, as a failing disk gives) or "stall" (writes `marker` holding its PID, then stops
    itself with SIGSTOP, the way a process hangs on a dead network filesystem; a test kills it there or lets the
    others time out). Once per marker: a restarted run goes on. `exit_delay`: seconds a failed process takes after
    the strategy's `on_exception`, as a teardown that flushes to a slow disk takes them. `quick_watcher`: Lightning's
    launcher watcher polls the ranks every millisecond (5 s by its default), so that it always sees a rank's end
    before this process does unless the engine keeps it from seeing it."""

    def __init__(
        self, marker: str, fault: str = "stall", rank: int = 1, step: int = 0, save_timeout: float = 60.0,
        exit_delay: float = 0.0, quick_watcher: bool = False,
    ):  # fmt: skip
        super().__init__(save_timeout=save_timeout)
        if quick_watcher:  # (the class Lightning's launcher builds its watcher from, when it starts the ranks)
            subprocess_script._ChildProcessObserver = QuickWatcher
        self.marker, self.fault, self.faulty_rank, self.step = Path(marker), fault, rank, step
        self.exit_delay = exit_delay

    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        time.sleep(self.exit_delay)

    def storage_writer(self, folder: Path) -> FileSystemWriter:
        faulty = (
            self.global_rank == self.faulty_rank
            and self.lightning_module.trainer.global_step >= self.step
            and not self.marker.exists()
        )
        return HalfWriter(folder, self) if faulty else super().storage_writer(folder)


class QuickWatcher(subprocess_script._ChildProcessObserver):
    def __init__(self, main_pid: int, child_processes: list, sleep_period: float = 0.001) -> None:
        super().__init__(main_pid, child_processes, sleep_period)


class HalfWriter(FileSystemWriter):
    def __init__(self, folder: Path, strategy: FaultyShardedStrategy) -> None:
        super().__init__(folder, single_file_per_rank=True, sync_files=True, overwrite=False)
        self.strategy = strategy

    def write_data(self, plan, planner):
        written = super().write_data(plan, planner)
        for result in written.value():
            file = Path(self.path) / result.storage_data.relative_path
            os.truncate(file, file.stat().st_size // 2)  # half of this rank's shards on disk
        self.strategy.marker.write_text(str(os.getpid()))
        if self.strategy.fault == "stall":
            os.kill(os.getpid(), signal.SIGSTOP)
        raise OSError(errno.EIO, os.strerror(errno.EIO))
