"""Atomic file writes: write to a temporary file in the same folder, fsync, rename, fsync the folder.

A crash (or kill -9) in the middle of a write leaves the previous file intact, never half of one;
what it can leave is the temporary file (`.NAME.XXXX.tmp`), which `stale_temporary_files` finds.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` to produce the file, then atomically move it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)  # the rename itself survives a power loss


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # platforms that cannot open a directory (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def stale_temporary_files(folder: str | os.PathLike) -> list[Path]:
    """Temporary files that an interrupted `atomic_write` left in `folder`."""
    return sorted(p for p in Path(folder).glob(".*.tmp") if p.is_file())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_write(path, write)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
