"""Where a dataset's files are found, in this order (docs/data.md):

1. `$HANDFORMER_DATA/DATASET/FILE`: a folder of datasets you point at;
2. the user's cache, `$XDG_CACHE_HOME/handformer/DATASET/FILE` (default `~/.cache/handformer`),
   where `handformer data get` writes;
3. `../shared/data/DATASET/FILE` beside the clone handformer runs from (this project's machines);
4. else the file is downloaded into the cache (data/download.py), checked against its sha256.

A machine that has the file nowhere and cannot download it gets one error saying what to run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from handformer.data.download import DownloadError, download
from handformer.data.sources import DATASETS, RemoteFile, dataset

ENV = "HANDFORMER_DATA"


class DataUnavailable(FileNotFoundError):
    """A dataset file that is on this machine nowhere and could not be downloaded."""


def cache_dir() -> Path:
    """The user's data cache: $XDG_CACHE_HOME/handformer, else ~/.cache/handformer."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "handformer"


def beside_clone() -> Path:
    """`../shared/data` beside the checkout this handformer was imported from."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def search_roots() -> list[tuple[str, Path]]:
    """(what it is, folder) of every place a dataset folder may be, in lookup order."""
    roots = [(f"${ENV}", Path(os.environ[ENV]))] if os.environ.get(ENV) else []
    return roots + [("the user's cache", cache_dir()), ("beside the clone", beside_clone())]


def _checked(path: Path, remote: RemoteFile) -> Path:
    size = path.stat().st_size
    if size != remote.size:
        raise ValueError(f"{path} has {size:,} bytes, not the published {remote.size:,}: it is not "
                         f"{remote.name} as published; remove it (`handformer data get` then fetches it)")
    return path


def find(name: str, file: str) -> Path | None:
    """The first copy of dataset `name`'s `file` in the lookup order, or None; no download."""
    remote = dataset(name).file(file)
    for _, root in search_roots():
        if (root / name / file).is_file():
            return _checked(root / name / file, remote)
    return None


def find_folder(name: str) -> Path | None:
    """The first folder in the lookup order that holds every file of dataset `name`, or None."""
    files = dataset(name).files
    for _, root in search_roots():
        if all((root / name / f.name).is_file() for f in files):
            return Path(root / name)
    return None


def where_to_put(name: str, file: str) -> str:
    return (f"run `handformer data get {name}` on a machine with a network, or put {file} in "
            f"{cache_dir() / name} "
            f"(or set {ENV} to a folder holding {name}/{file})")


def fetch(name: str, file: str, log: Callable[[str], None]) -> Path:
    """Download dataset `name`'s `file` into the cache, or raise DataUnavailable saying what to do."""
    remote = dataset(name).file(file)
    dest = cache_dir() / name / file
    try:
        download(remote, dest)
    except DownloadError as err:
        raise DataUnavailable(f"{name}/{file} is not on this machine and could not be downloaded "
                              f"({err}): {where_to_put(name, file)}") from None
    log(f"downloaded {name}/{file} ({remote.size / 1e6:.1f} MB, sha256 checked) from {remote.url} to {dest}")
    return dest


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def locate(name: str, file: str, download: bool = True, log: Callable[[str], None] = _stderr) -> Path:
    """Dataset `name`'s `file` on this machine, downloaded into the cache when it is nowhere."""
    found = find(name, file)
    if found is not None:
        return found
    if not download:
        raise DataUnavailable(f"{name}/{file} is not on this machine: {where_to_put(name, file)}")
    return fetch(name, file, log)


def folder(name: str, log: Callable[[str], None] = _stderr) -> Path:
    """A folder holding every file of dataset `name`: the first in the lookup order that has them
    all, else the cache, with the files it lacks downloaded."""
    found = find_folder(name)
    if found is not None:
        return found
    for f in dataset(name).files:
        if not (cache_dir() / name / f.name).is_file():
            fetch(name, f.name, log)
    return cache_dir() / name


def given_or_dataset_file(given: str, log: Callable[[str], None] = _stderr) -> Path:
    """`given` when it is there; else, when its name is a file of a public dataset (stories260K.bin),
    that file found or downloaded as a dataset's (the README's commands name them so)."""
    path = Path(given)
    if path.exists() or path.name != given:
        return path
    owners = [d.name for d in DATASETS.values() if any(f.name == given for f in d.files)]
    if not owners:
        return path
    found = locate(owners[0], given, log=log)
    log(f"{given}: none in this folder; reading the {owners[0]} dataset's, {found}")
    return found


def text_file(name: str) -> Path:
    """The text file a language model trains on for `[data] dataset = NAME`."""
    ds = dataset(name)
    if not ds.text:
        raise ValueError(f"dataset {name!r} is not a text corpus for a language model; "
                         f"give one of {', '.join(n for n, d in DATASETS.items() if d.text)}")
    return locate(name, ds.text)


def parallel_files(name: str, split: str, languages: list[str]) -> list[str]:
    """[source, target] files of a translation dataset's split (train, val or test)."""
    ds = dataset(name)
    if split not in ds.splits:
        raise ValueError(f"dataset {name!r} has no {split} split for translation")
    return [str(locate(name, ds.splits[split].format(lang=lang))) for lang in languages]
