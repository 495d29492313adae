"""One writer per run directory: `fit` holds an exclusive lock on `<run dir>/.lock` while it lives.

Two processes training into one directory overwrite each other's `last.ckpt`, TensorBoard events and top-k files.
The lock is a `flock` on the file, which the kernel drops when its holder exits however it exits (SIGKILL and the
out-of-memory killer included), so a dead run never blocks `fit --ckpt_path last`; nothing stale is left to clean up.
The file holds the holder's host and PID, for the message of the process that is refused.

On a shared filesystem the lock holds across machines where the filesystem carries flock locks to its server:
NFS (Linux clients turn flock into NFS byte-range locks), GPFS, CephFS, and Lustre mounted with `-o flock`. Lustre
with `-o localflock` and filesystems without lock support only keep out a second writer on the same machine.
Depends on nothing but the standard library.
"""

import errno
import fcntl
import os
import socket
from pathlib import Path

# The locks this process holds: each file's descriptor and how many RunLocks hold it (the CLI and ExactResume take
# one folder's lock both). A forked child (a data loader worker) shares the descriptors, and a flock is dropped only
# when every descriptor is closed: the child closes its copies at once, so a killed holder's workers, which live on
# for a few seconds, do not keep the lock.
_HELD: dict[Path, list[int]] = {}


def _close_held_locks_in_child() -> None:
    for fd, _ in _HELD.values():
        os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_held_locks_in_child)


class RunDirectoryBusy(RuntimeError):
    """Another live process holds the run directory's lock."""

    def __init__(self, run_dir: Path, holder: str) -> None:
        super().__init__(f"{run_dir} is being trained by {holder}")
        self.run_dir, self.holder = run_dir, holder


class RunLock:
    """An exclusive lock on a run directory (the file `filename` in it), held from `acquire` until `release` or the
    end of the process. `shared`: a lock this process holds already is shared (the CLI's and ExactResume's of one run)
    rather than refused."""

    def __init__(self, run_dir: Path, filename: str = ".lock", shared: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / filename
        self.shared = shared
        self._key: Path | None = None  # the lock file's resolved path while held

    def acquire(self) -> None:
        """Take the lock (creating the directory), or raise RunDirectoryBusy naming the holder's host and PID. A shared
        lock is dropped when its last holder in this process releases it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._key = self.path.resolve()
        if self.shared and self._key in _HELD:
            _HELD[self._key][1] += 1
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            self._key = None
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise RunDirectoryBusy(self.run_dir, self._holder()) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"host {socket.gethostname()} pid {os.getpid()}\n".encode())
        _HELD[self._key] = [fd, 1]

    def _holder(self) -> str:
        """Who holds the lock, as it wrote itself into the file (empty for an instant after it took the lock)."""
        try:
            return self.path.read_text().strip() or "another process (it has just started)"
        except OSError:
            return "another process"

    def release(self) -> None:
        key, self._key = self._key, None
        held = _HELD.get(key) if key is not None else None
        if held is not None:
            held[1] -= 1
            if held[1] == 0:
                del _HELD[key]
                os.close(held[0])  # closing the only descriptor drops the flock


def is_global_rank_zero() -> bool:
    """Whether this process is the first of its training job, read from what the launcher put in the environment
    (the trainer that knows for sure does not exist yet): torchrun sets RANK, srun SLURM_PROCID, and Lightning's own
    launcher LOCAL_RANK and NODE_RANK in the processes it starts."""
    env = os.environ
    if "RANK" in env:
        return env["RANK"] == "0"
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return env["SLURM_PROCID"] == "0"
    return env.get("LOCAL_RANK", "0") == "0" and env.get("NODE_RANK", "0") == "0"
