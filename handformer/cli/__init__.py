"""The `handformer` command line: a Transformer written by hand in PyTorch, trained, run, converted,
served, and a grader for your own.

Each subcommand is a thin layer over the library, one module a group of commands; each module's
`add_parsers` registers its commands."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from handformer.cli import (
    chat,
    check,
    compare,
    data,
    evaluate,
    experiment,
    export_gguf,
    export_hf,
    families,
    generate,
    import_gguf,
    import_hf,
    import_llama2c,
    learn,
    merge,
    prepare,
    quantize,
    see,
    serve,
    speedrun,
    trace,
    train,
    translate,
)
from handformer.paths import found_at

COMMANDS = [trace, train, translate, generate, chat, evaluate, import_hf, import_llama2c, import_gguf, see,
            check, learn, data, prepare, quantize, export_hf, export_gguf, experiment, merge, serve, speedrun,
            families, compare]


def build_parser() -> argparse.ArgumentParser:
    """Every command's options. main builds it once a process: nothing in it may depend on state that
    changes while the process runs (a list of choices that can grow is a view, as `data`'s names are)."""
    description = " ".join(__doc__.split("\n\n")[0].split())  # the docstring's first paragraph
    parser = argparse.ArgumentParser(prog="handformer", description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_parsers(sub)
    _own_usage(parser)
    return parser


# the arguments that name a file or a folder: an empty one would name the current folder (Path("")
# is "."), so `prepare "" OUT` would read every file here and `generate ""` look for a run here
PATH_ARGUMENTS = frozenset({"run_dir", "runs", "out_dir", "hf_dir", "path", "source", "out", "config",
                            "resume", "init_from", "data", "tokenizer", "file", "model"})


def path_text(value: str) -> str:
    """A path argument as given, refused when empty (argparse's usage error, exit 2)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path; give a file or a folder (`.` for this one)")
    return value


def _own_usage(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser records itself, so that an argument left over is reported with that
    command's usage (`handformer explain X`), not the top level's. Its path arguments refuse ""
    (path_text)."""
    parser.set_defaults(usage_parser=parser)
    for action in parser._actions:  # a path argument with no type of its own: never empty
        if action.dest in PATH_ARGUMENTS and action.type is None and action.nargs != 0:
            action.type = path_text
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for choice in action.choices.values():
            _own_usage(choice)


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The parser, built once a process (about 12 ms: a program or a test calling main many times
    pays it once); parse_args leaves it as it was."""
    return build_parser()


def os_error_line(err: OSError) -> str:
    """One line for an error of the file system: the path, what is wrong, and for a file where a
    folder belongs (an --out that is a file), what to give instead."""
    if err.filename is None:
        return str(err.strerror or err)
    if isinstance(err, (FileExistsError, NotADirectoryError)):
        path = Path(err.filename)
        files = [p for p in (path, *path.parents) if p.exists() and not p.is_dir()]
        if files:
            return (f"{files[-1]} is {found_at(files[-1])}, where a folder is needed; give a "
                    "folder (a new one is made), or move the file away")
    fix = {FileNotFoundError: "; give a path whose folders exist",
           PermissionError: "; give a path you may read and write"}.get(type(err), "")
    return f"{err.filename}: {err.strerror or err}{fix}"


def main(argv: Sequence[str] | None = None) -> int:
    args, left = _parser().parse_known_args(argv)
    if left:
        args.usage_parser.error(f"unrecognized arguments: {' '.join(left)}")
    args.own_process = argv is None  # the process's command, not a call from other code (a test)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        raw = getattr(err, "filename", None) is not None  # from the OS, not one of handformer's messages
        print(f"error: {os_error_line(err) if raw else err}", file=sys.stderr)
        return 2
    except OSError as err:  # permissions, a full disk, a directory where a file should be, ...
        print(f"error: {os_error_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C: files are whole (written atomically), no traceback
        print(f"\ninterrupted{f': {err}' if str(err) else ''}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
