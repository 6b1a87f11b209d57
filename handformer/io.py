"""Atomic file writes: write to a temporary file in the same folder, fsync, rename, fsync the folder.

A crash (or kill -9) in the middle of a write leaves the previous file intact, never half of one;
what it can leave is the temporary file (`.NAME.XXXX.tmp`), which `stale_temporary_files` finds.
Append-only logs (metrics.jsonl) are not rewritten for every line; `read_log_records` reads them
back, tolerating the torn last line a crash can leave.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handformer.paths import refuse_non_file


def _umask() -> int:
    """The process's umask, read once at import in the main thread (setting it is how it is read)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# mkstemp makes its file 0600; a finished file gets the mode open() would give it (0644 under umask 022)
FILE_MODE = 0o666 & ~_umask()

def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call `write(tmp_path)` to produce the file, then atomically move it to `path`. A `path` that
    is there but no regular file is refused: the rename would put a file in place of a device
    (/dev/null, as root) or a pipe, or fail on a folder naming only the temporary file."""
    refuse_non_file(path, "a file", "give the path of a file to write")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, FILE_MODE)
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


def read_log_records(path: str | os.PathLike) -> list[tuple[str, dict[str, Any]]]:
    """The complete records of an append-only JSON-lines log, each as (its line as written, the
    parsed object). The last line may be torn by a crash (cut short, or missing its newline): it is
    dropped unless it is a whole JSON object. A broken line before the last cannot come from a
    crash and is an error naming it."""
    path = Path(path)
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append((line, record))
        elif i < len(lines) - 1 and any(rest.strip() for rest in lines[i + 1:]):
            raise ValueError(f"{path} line {i + 1} is not a JSON object ({line[:40]!r}); only the "
                             "last line can be torn by a crash: delete or fix that line")
    return records


def check_export_target(run_dir: Path, out_dir: Path, overwrite: bool) -> None:
    """Refuse to export a run onto itself, or over an existing export unless `overwrite`."""
    if out_dir.exists() and out_dir.resolve() == run_dir.resolve():
        raise ValueError(f"OUT_DIR must differ from RUN_DIR {run_dir}")
    if (out_dir / "config.json").exists() and not overwrite:
        raise ValueError(f"{out_dir} already holds a config.json; choose another directory or "
                         "pass --overwrite")
