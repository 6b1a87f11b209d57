"""`handformer check`: grade a learner's hand-written Transformer against handformer's components."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from handformer.paths import refuse_non_file


def parse_components(values: list[str]) -> tuple[dict[str, str], list[str]]:
    """--component mha (check only that kind) and --component mha=MyAttention (use that name)."""
    from handformer.check.core.discovery import KINDS

    overrides, only = {}, []
    for value in values:
        kind, sep, name = value.partition("=")
        if kind not in KINDS:
            raise ValueError(f"--component {value}: unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
        if sep:
            if not name.isidentifier():
                raise ValueError(f"--component {value}: {name!r} is not a Python name")
            overrides[kind] = name
        only.append(kind)
    return overrides, only


def learner_file(path: str, lang: str = "en") -> str:
    """The learner's file as an absolute path, or an error in their language that says what to give
    instead."""
    given, zh = Path(path), lang == "zh"
    if given.is_dir():
        example = f"handformer check {given / 'model.py'}"
        raise FileNotFoundError(f"{path} 是文件夹：请给出定义组件的 .py 文件，例如 {example}"
                                if zh else f"{path} is a folder: give the .py file that defines your "
                                f"components, e.g. {example}")
    if not given.is_file():
        refuse_non_file(given, "a Python file", "give the .py file that defines your components")
        raise FileNotFoundError(f"{path}：没有这个文件" if zh else f"{path}: no such file")
    if given.suffix != ".py":
        raise ValueError(f"{path} 不是 Python 文件（.py）：check 把文件当作 Python 导入。笔记本请先导出代码："
                         f"jupyter nbconvert --to script {given.name}" if zh else
                         f"{path} is not a Python file (.py): check imports the file as Python. For a "
                         f"notebook, save its code first: jupyter nbconvert --to script {given.name}")
    if b"\0" in given.read_bytes():  # UTF-16 (Notepad's "Unicode") or a binary file
        raise ValueError(f"{path} 不是 Python 源码：里面有 NUL 字节（二进制文件，或者存成了 UTF-16？）；"
                         "请存成 UTF-8 文本" if zh else f"{path} is not Python source: it holds NUL bytes "
                         "(a binary file, or text saved as UTF-16?); save it as UTF-8 text")
    return path


def given_path(args: argparse.Namespace) -> str:
    """The file to check: the path, or the last value of a --component written before it
    (`--component mha model.py`, which argparse reads as two kinds)."""
    if args.path is None and args.component and args.component[-1].endswith(".py"):
        return args.component.pop()
    if args.path is None:
        raise ValueError("give the file to check: handformer check FILE [--component KIND ...]")
    return args.path


def cmd_check(args: argparse.Namespace) -> int:
    from handformer.check.core import zygote
    from handformer.check.core.report import default_language, exit_code, format_report, to_json
    from handformer.check.core.sandbox import check_in_child

    path = given_path(args)
    overrides, only = parse_components(args.component)
    if args.time_limit <= 0 or args.memory_limit < 1024:
        raise ValueError("--time-limit must be > 0 seconds and --memory-limit at least 1024 MiB "
                         "(torch itself needs about 1 GiB of address space)")
    convention = None if args.mask_convention == "auto" else args.mask_convention
    if args.own_process:  # it has imported torch and nothing of theirs: its copy forks the child
        zygote.fork_here()
    lang = args.lang or default_language()
    result = check_in_child(learner_file(path, lang), overrides, only, convention, args.time_limit,
                            args.memory_limit, args.adapters)
    result.path = path  # as the learner typed it
    if args.json:
        sys.stdout.write(to_json(result) + "\n")
    else:
        sys.stdout.write(format_report(result, lang, args.time_limit, args.memory_limit, args.debug))
    return exit_code(result)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from handformer.check.core.discovery import KINDS
    from handformer.check.core.sandbox import MEMORY_LIMIT, TIME_LIMIT, WALL_FACTOR

    p = sub.add_parser(
        "check", help="grade your own hand-written Transformer components against handformer's",
        description="Import PATH (its code runs, as pytest runs a test file: in a child process with "
        "a time and a memory limit), find the components it defines (attention, multi-head and "
        "grouped-query attention, RoPE, FFN and SwiGLU, LayerNorm, RMSNorm, positional encoding, "
        "encoder/decoder layers, decoder-only blocks, the causal mask, the encoder-decoder model; "
        "temperature, top-k, top-p, greedy, a sampling step, generate; in the tutorials', the "
        "Annotated Transformer's, d2l's or nanoGPT's style), copy weights between them and "
        "handformer's, and compare outputs, attention weights and gradients; name classic mistakes "
        "and the line they are on. Exit code 0: every component was checked and passes (or differs by "
        "design, e.g. pre-norm); 1: any fails; 3: nothing failed but some component was NOT CHECKED "
        "(check could not build or drive it; the report prints the adapter that lets it); 2: bad arguments "
        "(no such file, an unknown kind, a --component NAME the file does not define).")
    p.add_argument("path", nargs="?", help="your Python file")
    p.add_argument("--component", action="extend", nargs="+", default=[], metavar="KIND[=NAME]",
                   help="check only these kinds (one or more, repeatable); KIND=NAME checks your "
                   "class or function NAME as that kind, e.g. --component mha=MyAttention. Kinds: "
                   + ", ".join(KINDS))
    p.add_argument("--lang", choices=["en", "zh"], default=None,
                   help="report language (default: from the locale, zh for a Chinese one)")
    p.add_argument("--json", action="store_true", help="print JSON (for an autograder) instead of text")
    p.add_argument("--debug", action="store_true",
                   help="under a component check could not drive, show check's own error (--json always "
                   "carries it, as the error's detail)")
    p.add_argument("--mask-convention", choices=["auto", "int", "bool", "additive", "torch"],
                   default="auto", help="how your code reads masks: auto detects 0/1 int (0 = masked), "
                   "bool True = keep, and additive float masks; torch = bool True = masked (torch.nn's "
                   "convention, which auto reports as an inverted mask)")
    p.add_argument("--adapters", metavar="FILE", default=None,
                   help="a Python file of adapter functions for what check cannot infer: "
                   "make_<kind>(d_model, n_heads, ...) returns your module of that kind, <kind>(...) "
                   "calls your function as check calls it (default: handformer_adapters.py beside your "
                   "file, when there is one); a NOT "
                   "CHECKED component prints the adapter to write")
    p.add_argument("--time-limit", type=float, default=TIME_LIMIT,
                   help=f"seconds of CPU time for each step of your code (default {TIME_LIMIT:g}; a step "
                   f"that sleeps or waits is stopped after {WALL_FACTOR:g} times that on the clock)")
    p.add_argument("--memory-limit", type=int, default=MEMORY_LIMIT,
                   help=f"MiB of address space for the process running your code (default {MEMORY_LIMIT})")
    p.set_defaults(func=cmd_check)
