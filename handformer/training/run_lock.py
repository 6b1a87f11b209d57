"""One training process a run directory: `handformer train` holds an exclusive lock on RUN/train.lock
while it runs, so a second one on the same directory stops with an error naming the first's pid
instead of interleaving checkpoints and metrics.

The lock is the kernel's (flock): it goes away with the process, even after kill -9, so a crashed run
never leaves a stale lock behind. The file keeps the pid of its last holder for the error message.
Holding the lock, the run removes the temporary files an earlier run killed mid-write left behind.
Where flock does not exist (Windows), no lock is taken.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from handformer.io import stale_temporary_files

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

LOCK_NAME = "train.lock"


class RunDirectoryBusy(ValueError):
    """Another process holds the run directory's lock."""


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, enabled: bool = True) -> Iterator[None]:
    """Hold RUN/train.lock for the duration of the block; raise RunDirectoryBusy if it is taken."""
    if not enabled or fcntl is None:
        yield
        return
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise RunDirectoryBusy(
                f"{run_dir} is in use by another `handformer train` (pid {holder}); wait for it to "
                f"finish or stop it (kill {holder}), or train into another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        for leftover in stale_temporary_files(run_dir):  # from a run killed mid-write; ours now
            leftover.unlink()
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
        # A run that stopped before writing anything (a bad config, missing data) leaves no trace.
        if created and [p.name for p in run_dir.iterdir()] == [LOCK_NAME]:
            (run_dir / LOCK_NAME).unlink()
            run_dir.rmdir()
