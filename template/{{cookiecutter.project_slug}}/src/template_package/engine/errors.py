"""How a failed command is reported: one line for a mistake in what the user gave or a fault of the machine, a
traceback for anything else.

Decided by the error's type, never by where it was raised: a mistake is reported with the project's own
`UsageError` (its message names the value and what to do), Lightning's `MisconfigurationException` (raised for
configuration mistakes only), an option the parser refused, a checkpoint that could not be written or read back as
it was written (resume/digests.py), or an OS error
of a write that the machine refused (a full disk, a quota, a file size limit, a read-only or failing disk), or a store
that stopped answering (remote_run.StoreError). Anything else, a ValueError from torch or from a line of the user's
own model or data code included, is a bug to find, and keeps its traceback.
"""

import errno
import re
from pathlib import Path

from lightning.fabric.utilities.exceptions import MisconfigurationException

from .resume.digests import DamagedCheckpoint
from .resume.durable import CheckpointWriteError
from .resume.remote_run import StoreError
from .resume.whole_checkpoint import is_checkpoint, saved_step


class UsageError(ValueError):
    """A mistake in what the user gave (an option's value, a data folder, a checkpoint): its message, which names
    the value and what to do instead, is the one line the user sees. Raise it from your own model or data code for
    the same treatment; any other exception there keeps its traceback."""


class NonFiniteLoss(UsageError, FloatingPointError):
    """The loss became NaN or infinite: the run stops before the step reaches the weights."""


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


def is_a_users_mistake(error: BaseException) -> bool:
    """Whether `error` reports a mistake in what the user gave or a fault of the machine (one line), rather than a
    bug (a traceback)."""
    mistakes = UsageError | CheckpointWriteError | DamagedCheckpoint | StoreError | MisconfigurationException
    if isinstance(error, mistakes):
        return True
    return isinstance(error, OSError) and error.errno in MACHINE_FAULTS


def original_error(error: BaseException) -> BaseException:
    """The error a class raised while the CLI built it: jsonargparse wraps it in a ValueError of its own ("Does not
    validate against any of the Union subtypes"), raised from the original."""
    while isinstance(error, ValueError) and error.__cause__ is not None and _raised_by_jsonargparse(error):
        error = error.__cause__
    return error


def _raised_by_jsonargparse(error: BaseException) -> bool:
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback is not None and "jsonargparse" in Path(traceback.tb_frame.f_code.co_filename).parts


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
    return re.sub(r"^[\w.]+(Error|Exception): ", "", lines[-1])


def what_last_ckpt_holds(run_dir: Path) -> str:
    last = run_dir / "checkpoints" / "last.ckpt"
    if not is_checkpoint(last):
        return f"no {last} was written"
    try:
        step = saved_step(last)
    except Exception as error:  # noqa: BLE001 - the message must still be one line
        return f"{last} cannot be read ({type(error).__name__})"
    return f"{last} still holds step {step}"
