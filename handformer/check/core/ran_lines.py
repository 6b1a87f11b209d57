"""The functions of the learner's file that ran while check drove one component, so that a mistake's
line is looked for where their code runs: a tiled attention's mask line, not the same-looking line of
a reference function beside it that the module never calls (a `use_flash` path taken, the other not).

    with recording(path):            # check_component: the component built, driven, graded
        ... first_line(...)          # lines of functions that did not run last (ran_first)

Calls are recorded, not lines (line events would cost a tokenizer's trainer most of its time again).
A function counts as not run only when a function that ran names it (a call, `self.attend`) and it
was not recorded. Lines outside every function (a class body) are always kept.
"""

from __future__ import annotations

import ast
import functools
import linecache
import sys
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Record:
    path: str  # the learner's file
    ran: set[int] = field(default_factory=set)  # the lines its functions that ran start on


_RAN = [_Record("")]  # the component being checked last; at the bottom none
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _call(frame: Any, event: str, arg: Any) -> None:
    """Each call of a function of the learner's file, by the line its definition starts on; no line
    events are asked for."""
    code = frame.f_code
    if code.co_filename == _RAN[-1].path:
        _RAN[-1].ran.add(code.co_firstlineno)


class recording:  # noqa: N801  (a context manager, read as `with recording(path):`)
    """Record the functions of `path` that run in the block (one component's check; a component
    checked inside another's records its own), where no other tracer is on (a coverage tool's)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.old = sys.gettrace()  # None, or ours (a component checked in another's check)
        _RAN.append(_Record({None: self.path, _call: self.path}.get(self.old, "")))
        sys.settrace(self.old or _call)

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self.old)
        _RAN.pop()


def ran_first(*tiers: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """The tiers of (line number, text) without the lines of functions that did not run although a
    function that ran names them (`naive_attention` beside the tiled call the forward took), then the
    tiers whole. A function no recorded call names may have run unrecorded: it is kept."""
    path, ran = _RAN[-1].path, _RAN[-1].ran
    inner, names = _functions(path)
    named = set().union(*(names[start][1] for start in ran if start in names))
    skipped = {start for start, (name, _) in names.items() if start not in ran and name in named}
    return [[nl for nl in tier if inner.get(nl[0]) not in skipped] for tier in tiers] + list(tiers)


@functools.lru_cache(maxsize=8)
def _functions(path: str) -> tuple[dict[int, int], dict[int, tuple[str, frozenset[str]]]]:
    """Each line inside a function of the file -> the line the innermost function holding it starts on
    (its first decorator's, as its code object counts it); and each function's start -> its name and
    the names its code reads (`naive_attention(`, `self.attend(`)."""
    tree = ast.parse("".join(linecache.getlines(path)))
    functions = [f for f in ast.walk(tree) if isinstance(f, FUNCTIONS)]
    inner: dict[int, int] = {}
    names: dict[int, tuple[str, frozenset[str]]] = {}
    for f in sorted(functions, key=lambda f: f.end_lineno - f.lineno, reverse=True):
        start = (f.decorator_list or [f])[0].lineno
        inner.update(dict.fromkeys(range(f.lineno, f.end_lineno + 1), start))  # the innermost kept
        names[start] = f.name, frozenset(getattr(n, "id", getattr(n, "attr", "")) for n in ast.walk(f))
    return inner, names
