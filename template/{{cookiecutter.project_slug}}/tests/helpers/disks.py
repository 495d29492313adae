"""A way to fill a disk (conftest.small_disk mounts one for a test)."""

from pathlib import Path


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler
