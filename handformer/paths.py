"""What a path names, in the words of an error message.

A path that is there but is no regular file (a folder, `/dev/null`, a named pipe) is not a missing
file: "no config file /dev/null" sends the user looking for a file that exists. `kind_of` says what
is there; `refuse_non_file` raises with it, before a command's own "no such file" message.
`found_at` names a regular file too ("a file"), and `missing_from` says why a folder that should
hold a file does not ("no config.json", "it is a file", "nothing is there").
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


def found_at(path: str | os.PathLike) -> str | None:
    """What is at `path`: "a file" (a regular one, or a link to one), "a folder", "a character
    device", ... (kind_of); None when nothing is there."""
    return kind_of(path) or ("a file" if os.path.exists(path) else None)


def missing_from(folder: str | os.PathLike, name: str) -> str:
    """Why `folder` holds no file `name`, for an error message: "no NAME" (a folder without it),
    "it is a file" (or another kind), or "nothing is there"."""
    found = found_at(folder)
    if found == "a folder":
        return f"no {name}"
    return f"it is {found}" if found else "nothing is there"


def refuse_non_file(path: str | os.PathLike, wanted: str, fix: str) -> None:
    """Raise ValueError "PATH is KIND, not WANTED; FIX" when `path` exists but is no regular file."""
    kind = kind_of(path)
    if kind is not None:
        raise ValueError(f"{path} is {kind}, not {wanted}; {fix}")


__all__ = ["found_at", "kind_of", "missing_from", "refuse_non_file"]
