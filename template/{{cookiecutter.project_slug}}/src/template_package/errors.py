"""How a failed command is reported: one line for a mistake in what the user gave or a fault of the machine, a
traceback for anything else.

A mistake (a bad option value, a data folder without classes, a warmup longer than the run) is caught by a check of
this project's, which raises with a message that names the value and what to do: the user needs that line, not a
traceback. So does a disk that is full, read-only or failing, whatever write hits it first. Everything else, a
ValueError from inside torch or from a line of the user's own model or data code included, is a bug to find, and
keeps its traceback. So the line is kept for exactly: the errors that a `raise` statement in this package's own
source created, Lightning's MisconfigurationException (raised for configuration mistakes only), failed checkpoint
writes, and the OS errors of a write that the machine refused.
"""

import errno
import linecache
import re
from pathlib import Path

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException

from .durable import CheckpointWriteError

PACKAGE_DIR = Path(__file__).resolve().parent

# What the user can do about a failed write, by its cause; the first five are the machine's, wherever they occur.
WRITE_ADVICE = {
    errno.ENOSPC: "free space on that disk",
    errno.EDQUOT: "free space within your disk quota",
    errno.EFBIG: "raise the file size limit (ulimit -f)",
    errno.EROFS: "the filesystem is read-only",
    errno.EIO: "check the disk (an I/O error)",
    errno.EACCES: "make the folder writable",
    errno.EPERM: "make the folder writable",
}
MACHINE_FAULTS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)

# Errors raised inside a data loader worker arrive re-raised by torch, with the worker's traceback as text.
WORKER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*(\S[^\n]*)')


def is_a_users_mistake(error: BaseException) -> bool:
    """Whether `error` reports a mistake in what the user gave (one line) rather than a bug (a traceback)."""
    if isinstance(error, CheckpointWriteError | MisconfigurationException):
        return True
    if isinstance(error, OSError) and error.errno in MACHINE_FAULTS:
        return True
    if not isinstance(error, ValueError | OSError | FloatingPointError | ImportError):
        return False
    if "Original Traceback" in str(error):  # from a loader worker: its innermost frame, from the text
        frames = WORKER_FRAME.findall(str(error))
        if not frames:
            return False
        file, _, source = frames[-1]
        return _in_package(file) and source.startswith("raise")
    traceback = error.__traceback__
    if traceback is None:
        return False
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    file = traceback.tb_frame.f_code.co_filename
    return _in_package(file) and linecache.getline(file, traceback.tb_lineno).strip().startswith("raise")


def _in_package(file: str) -> bool:
    return Path(file).resolve().is_relative_to(PACKAGE_DIR)


def one_line(error: BaseException, run_dir: Path | None = None) -> str:
    """The error's message as one line; for a failed write, what to do and what `last.ckpt` of `run_dir` holds."""
    failed_write = ""
    if run_dir is not None and isinstance(error, CheckpointWriteError):
        failed_write = str(error)
    elif run_dir is not None and isinstance(error, OSError) and error.errno in WRITE_ADVICE:
        failed_write = f"cannot write into {run_dir} ({error.strerror})"
    if failed_write:
        advice = WRITE_ADVICE.get(error.errno)
        advice = f": {advice}, or give another --trainer.default_root_dir" if advice else ""
        return f"{failed_write}{advice}; {what_last_ckpt_holds(run_dir)}"
    # A worker's error ends with the original "ValueError: message" line.
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return re.sub(r"^\w+(Error|Exception): ", "", lines[-1])


def what_last_ckpt_holds(run_dir: Path) -> str:
    last = run_dir / "checkpoints" / "last.ckpt"
    if not last.is_file():
        return f"no {last} was written"
    try:
        step = torch.load(last, map_location="cpu", weights_only=True, mmap=True)["global_step"]
    except Exception as error:  # noqa: BLE001 - the message must still be one line
        return f"{last} cannot be read ({type(error).__name__})"
    return f"{last} still holds step {step}"
