"""The lines of the learner's file that ran while check drove one component, so that a mistake's line
is looked for where their code runs: a tiled attention's mask line, not the same-looking line of a
reference function beside it that the module never calls (a `use_flash` path taken, the other not).

    with recording(path):            # check_component: the component built, driven, graded
        ... first_line(...)          # lines that ran first (ran_first), then the others

Only lines inside a function are judged (a class body or the module's own code ran on import, where
no record was kept). A statement ran when any line of it did (a call over two lines reports its
second). While another tracer is on (the localizer's, a coverage tool's) nothing is recorded, and with
nothing recorded every line counts as run: the order of the lines stays as it was.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import linecache
import sys
from collections.abc import Iterator
from typing import Any

_RAN: list[tuple[str, set[int]]] = []  # (file, its lines that ran), the innermost component's last


def _line(frame: Any, event: str, arg: Any) -> Any:
    if event == "line" and _RAN and frame.f_code.co_filename == _RAN[-1][0]:
        _RAN[-1][1].add(frame.f_lineno)
    return _line


def _call(frame: Any, event: str, arg: Any) -> Any:
    return _line if _RAN and frame.f_code.co_filename == _RAN[-1][0] else None


@contextlib.contextmanager
def recording(path: str) -> Iterator[None]:
    """Record the lines of `path` that run in the block (its frames alone are traced line by line);
    a component checked inside another's check records its own."""
    old = sys.gettrace()
    _RAN.append((path, set()))
    if old is None:
        sys.settrace(_call)
    try:
        yield
    finally:
        if old is None:
            sys.settrace(None)
        _RAN.pop()


def never_ran(lines: list[tuple[int, str]]) -> set[int]:
    """The numbers among `lines` of statements inside a function of the file being recorded that did
    not run while it was; none when nothing is recorded."""
    if not _RAN or not _RAN[-1][1]:
        return set()
    path, ran = _RAN[-1]
    spans = _statement_spans(path)
    return {n for n, _ in lines if n in spans and not ran & spans[n]}


@functools.lru_cache(maxsize=8)
def _statement_spans(path: str) -> dict[int, frozenset[int]]:
    """Each line inside a function of the file -> the lines of the innermost statement holding it."""
    try:
        tree = ast.parse("".join(linecache.getlines(path)))
    except (SyntaxError, ValueError):
        return {}
    spans: dict[int, frozenset[int]] = {}
    bodies = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    statements = [s for f in bodies for b in f.body for s in ast.walk(b) if isinstance(s, ast.stmt)]
    for stmt in sorted(statements, key=lambda s: s.end_lineno - s.lineno, reverse=True):
        lines = frozenset(range(stmt.lineno, stmt.end_lineno + 1))
        spans.update(dict.fromkeys(lines, lines))  # the smaller statements last: the innermost kept
    return spans
