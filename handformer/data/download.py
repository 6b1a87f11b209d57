"""Downloading one public file, checked: the bytes stream into a temporary file beside the target,
their size and sha256 are checked, and only then is the file renamed into place. A crash or a
dropped connection at any byte leaves nothing under the final name; a file whose digest differs
is not kept."""

from __future__ import annotations

import hashlib
import http.client
import urllib.error
import urllib.request
from pathlib import Path

from handformer.data.sources import RemoteFile
from handformer.io import atomic_write

CHUNK = 1 << 16


class DownloadError(OSError):
    """A download that did not give the published file: no network, an HTTP error, a connection
    closed early, or other bytes than the digest says."""


def _reason(err: BaseException) -> str:
    """A short reason for a failed request: 'Connection refused', 'HTTP 404 Not Found', ..."""
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        err = err.reason if isinstance(err.reason, BaseException) else OSError(str(err.reason))
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


def _stream(remote: RemoteFile, tmp: str, timeout: float) -> None:
    """Write the URL's body to `tmp`, then check its size and sha256 (raising DownloadError)."""
    digest, size = hashlib.sha256(), 0
    try:
        with urllib.request.urlopen(remote.url, timeout=timeout) as response, open(tmp, "wb") as out:
            while chunk := response.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
    except (OSError, http.client.HTTPException) as err:
        raise DownloadError(f"downloading {remote.url} failed: {_reason(err)}") from None
    if size != remote.size:
        raise DownloadError(f"{remote.url} gave {size:,} bytes, not {remote.size:,} (the connection "
                            "closed early?); nothing was kept: run the command again")
    if digest.hexdigest() != remote.sha256:
        raise DownloadError(f"{remote.url} gave a file whose sha256 is {digest.hexdigest()}, not the "
                            f"published {remote.sha256}; it was not kept")


def download(remote: RemoteFile, dest: str | Path, timeout: float = 60.0) -> Path:
    """Fetch `remote` to `dest`, checked against its size and sha256, written atomically."""
    dest = Path(dest)
    atomic_write(dest, lambda tmp: _stream(remote, tmp, timeout))
    return dest
