"""A checkpoint file's digest, written beside it as it is written and checked whenever it is read, so that a file
that changed afterwards (a flipped bit on a disk or in a transfer, a copy cut short, a tail of zeros, a part
overwritten or taken from another checkpoint) is refused in one line before a tensor of it reaches a model.

`X.ckpt.crc32` holds the CRC-32 of every byte of `X.ckpt` and its size, one line, `1a2b3c4d 145123`, and the time
its state was taken where the checkpoint says (`taken_at`: resume/leftovers.py reads it). torch's loader
checks nothing, and the zip's own CRC checks cover only each record's data, not the zip's headers, the pickle's
framing or a whole record swapped in with its own CRC. The digest covers every byte; CRC-32 finds any change of up to
32 bits in a row and all but one in 2**32 of the others, which is all an accident does. It proves nothing against a
deliberate change, which could rewrite the digest too (docs/decisions.md: why CRC-32 and not SHA-256).
durable.py computes it from the bytes as they are written, writes it durably and removes it with its file. A file
without one (an earlier release's, or a CheckpointIO of your own's) is read as before, with the zip's own checks.
Depends on nothing but the standard library.
"""

import zipfile
import zlib
from pathlib import Path

SUFFIX = ".crc32"
TAKEN_AT = "taken_at"  # in every checkpoint of a fit with ExactResume: the time its state was taken (time.time())
_CHUNK = 1 << 23
_INTACT: set[tuple] = set()  # the files this process found intact, as (path, inode, size, mtime, digest's mtime)


class DamagedCheckpoint(ValueError):
    """A checkpoint file is not what was written: `reason` says how (one line)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path} is damaged: {reason}")
        self.path, self.reason = Path(path), reason


def digest_of(path: str | Path) -> Path:
    """Where the digest of the checkpoint file `path` is: beside it, its name and `.crc32`."""
    path = Path(path)
    return path.with_name(path.name + SUFFIX)


def crc32_of(path: Path) -> int:
    crc, buffer = 0, bytearray(_CHUNK)
    with open(path, "rb", buffering=0) as file:
        while read := file.readinto(buffer):
            crc = zlib.crc32(memoryview(buffer)[:read], crc)
    return crc


def write_digest(path: Path, crc: int, size: int, taken_at: float | None) -> None:
    """Write the digest line into `path` (a temporary file, which durable.py fsyncs and renames into place)."""
    path.write_text(f"{crc:08x} {size}{'' if taken_at is None else f' {taken_at!r}'}\n")


def taken_at(digest: str) -> float | None:
    """The time a checkpoint's state was taken, from its digest's text; None where it does not say."""
    fields = digest.split()
    return float(fields[2]) if len(fields) > 2 else None


def damage(path: str | Path) -> str | None:
    """How the checkpoint file `path` differs from what was written, or None when it is intact: its size or CRC-32
    against its digest, or for a file without a digest, the zip's own check of each record."""
    path, digest = Path(path), digest_of(path)
    key = _key(path, digest)
    if key in _INTACT:
        return None
    try:
        crc, size = digest.read_text().split()[:2]
        crc, size = int(crc, 16), int(size)
    except FileNotFoundError:
        reason = _zip_damage(path)
    except (OSError, ValueError, UnicodeDecodeError) as error:
        return f"its digest {digest.name} cannot be read ({getattr(error, 'strerror', None) or 'not a digest'})"
    else:
        reason = _differs(path, digest.name, crc, size)
    if reason is None and key is not None:
        _INTACT.add(key)
    return reason


def verify(path: str | Path) -> None:
    """Raise DamagedCheckpoint when the checkpoint file `path` is not what was written (see `damage`)."""
    reason = damage(path)
    if reason is not None:
        raise DamagedCheckpoint(path, reason)


def _differs(path: Path, digest: str, crc: int, size: int) -> str | None:
    actual = path.stat().st_size
    if actual != size:
        return f"it has {actual:,} bytes, its digest {digest} says {size:,}: cut short or grown since it was written"
    actual = crc32_of(path)
    if actual != crc:
        return (
            f"its CRC-32 is {actual:08x}, its digest {digest} says {crc:08x}: changed since it was written (a flipped "
            "bit, a part overwritten or taken from another file)"
        )
    return None


def _zip_damage(path: Path) -> str | None:
    """The zip's own check of a file without a digest: the first record whose data fails its CRC-32 (a file that is
    no zip, or whose directory is gone, is left to torch's loader, which names what it cannot read)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError):
        return None
    return None if bad is None else f"its record {bad} fails the zip's CRC-32 (it has no digest {digest_of(path).name})"


def _key(path: Path, digest: Path) -> tuple | None:
    try:
        stat = path.stat()
        digest_time = digest.stat().st_mtime_ns if digest.exists() else None
    except OSError:
        return None
    return str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, digest_time
