"""What a path names, in the words of an error message.

A path that is there but is no regular file (a folder, `/dev/null`, a named pipe) is not a missing
file: "no config file /dev/null" sends the user looking for a file that exists. `kind_of` says what
is there; `refuse_non_file` raises with it, before a command's own "no such file" message.
"""

from __future__ import annotations

import os
import stat

KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
         (stat.S_ISSOCK, "a socket"))


def kind_of(path: str | os.PathLike) -> str | None:
    """What `path` names when it exists but is no regular file ("a folder", "a character device",
    ...); None when it is a regular file (or a link to one) or when nothing is there."""
    try:
        mode = os.stat(path).st_mode  # follows links: a link to a file is a file
    except OSError:  # nothing there, a dangling link, a parent that is a file, no permission
        return None
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in KINDS if test(mode)), "a special file")


def refuse_non_file(path: str | os.PathLike, wanted: str, fix: str) -> None:
    """Raise ValueError "PATH is KIND, not WANTED; FIX" when `path` exists but is no regular file."""
    kind = kind_of(path)
    if kind is not None:
        raise ValueError(f"{path} is {kind}, not {wanted}; {fix}")


__all__ = ["kind_of", "refuse_non_file"]
