"""`handformer data list`, `handformer data get NAME` and `handformer data path NAME`: the public
datasets the configs name, where each is found on this machine, and their download into the user's
cache (docs/data.md)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator


class DatasetNames:
    """The choices of a dataset argument, read when the arguments are parsed (the parser is built once
    a process, and a program may add to DATASETS after that): every dataset's name, then `extra`."""

    def __init__(self, *extra: str) -> None:
        self.extra = extra

    def __contains__(self, name: object) -> bool:
        from handformer.data.sources import DATASETS

        return name in DATASETS or name in self.extra

    def __iter__(self) -> Iterator[str]:
        from handformer.data.sources import DATASETS

        return iter([*DATASETS, *self.extra])


def _status(name: str) -> str:
    """One line: where dataset `name` is, or what to run to get it."""
    from handformer.data.lookup import find, find_folder, search_roots
    from handformer.data.sources import dataset

    folder = find_folder(name)
    if folder is not None:
        where = next(what for what, root in search_roots() if folder == root / name)
        return f"{name:16} here: {folder} ({where})"
    files = dataset(name).files
    have = sum(find(name, f.name) is not None for f in files)
    return f"{name:16} missing{f' ({have} of {len(files)} files here)' if have else ''}: run " \
           f"`handformer data get {name}`"


def cmd_list(args: argparse.Namespace) -> int:
    from handformer.data.lookup import search_roots
    from handformer.data.sources import DATASETS

    print("looked up in: " + ", then ".join(f"{root} ({what})" for what, root in search_roots()))
    for name, ds in DATASETS.items():
        print(_status(name))
        print(f"{'':16} {ds.about}; {sum(f.size for f in ds.files) / 1e6:.1f} MB")
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    from handformer.data.lookup import fetch, find
    from handformer.data.sources import DATASETS, dataset

    names = list(DATASETS) if args.names == ["all"] else args.names
    for name in names:
        for remote in dataset(name).files:
            found = find(name, remote.name)
            if found is None:
                found = fetch(name, remote.name, print)
            print(f"{name}/{remote.name}: {found}")
    return 0


def cmd_path(args: argparse.Namespace) -> int:
    """Print where a dataset (or one of its files) is, for scripts: `--data "$(handformer data path ...)"`."""
    from handformer.data.lookup import DataUnavailable, find_folder, locate
    if args.file:
        print(locate(args.name, args.file, download=False))
        return 0
    folder = find_folder(args.name)
    if folder is None:
        raise DataUnavailable(f"{args.name} is not on this machine (every one of its files in one folder): "
                              f"run `handformer data get {args.name}`")
    print(folder)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from handformer.data.sources import DATASETS

    p = sub.add_parser("data", help="the public datasets configs name: list them, download them",
                       description="Datasets are looked up in $HANDFORMER_DATA, the user's cache "
                                   "(~/.cache/handformer), then ../shared/data beside the clone, and "
                                   "downloaded into the cache when missing (docs/data.md).")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="each dataset and where it is found").set_defaults(func=cmd_list)
    get = actions.add_parser("get", help="download datasets into the user's cache, checked by sha256")
    get.add_argument("names", nargs="+", metavar="NAME", choices=DatasetNames("all"),
                     help=f"{', '.join(DATASETS)}, or all")
    get.set_defaults(func=cmd_get)
    path = actions.add_parser("path", help="print where a dataset or one of its files is (no download)")
    path.add_argument("name", metavar="NAME", choices=DatasetNames(), help=", ".join(DATASETS))
    path.add_argument("file", nargs="?", default=None, help="one of its files (default: its folder)")
    path.set_defaults(func=cmd_path)
