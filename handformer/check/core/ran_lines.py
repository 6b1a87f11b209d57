"""The lines of the learner's file that ran while check drove one component, so that a mistake's line
is looked for where their code runs: a tiled attention's mask line, not the same-looking line of a
reference function beside it that the module never calls (a `use_flash` path taken, the other not).

    with recording(path):            # check_component: the component built, driven, graded
        ... first_line(...)          # lines that ran first (ran_first), then all

Only lines inside a function are judged (a class body or the module's own code ran on import, where
no record was kept). A statement ran when any line of it did (a call over two lines reports its
second). While another tracer is on (a coverage tool's) nothing is recorded; with nothing recorded
no line is known to have run, and the lines are searched as they come.
"""

from __future__ import annotations

import ast
import functools
import linecache
import sys
from typing import Any

# (file, its lines that ran) of the component being checked, the innermost last; at the bottom none
_RAN: list[tuple[str, set[int]]] = [("", set())]
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _line(frame: Any, event: str, arg: Any) -> Any:
    _RAN[-1][1].add(frame.f_lineno)
    return _line


def _call(frame: Any, event: str, arg: Any) -> Any:
    return _line if frame.f_code.co_filename == _RAN[-1][0] else None  # the learner's frames alone


class recording:  # noqa: N801  (a context manager, read as `with recording(path):`)
    """Record the lines of `path` that run in the block (its frames alone are traced line by line);
    a component checked inside another's check records its own."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.old = sys.gettrace()  # None, or ours (a component checked in another's check)
        _RAN.append(({None: self.path, _call: self.path}.get(self.old, ""), set()))
        sys.settrace(self.old or _call)

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self.old)
        _RAN.pop()


def ran_first(*tiers: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """The tiers of (line number, text) with only the lines known to have run (or outside every
    function: they ran on import), then the tiers whole."""
    path, ran = _RAN[-1]
    spans = _statement_spans(path)
    return [[nl for nl in tier if ran & spans.get(nl[0], ran)] for tier in tiers] + list(tiers)


@functools.lru_cache(maxsize=8)
def _statement_spans(path: str) -> dict[int, frozenset[int]]:
    """Each line inside a function of the file -> the lines of the innermost statement holding it."""
    tree = ast.parse("".join(linecache.getlines(path)))
    functions = [f for f in ast.walk(tree) if isinstance(f, FUNCTIONS)]
    statements = [s for f in functions for s in ast.walk(f) if isinstance(s, ast.stmt)]
    spans: dict[int, frozenset[int]] = {}
    for stmt in sorted(statements, key=lambda s: s.end_lineno - s.lineno, reverse=True):
        lines = frozenset(range(stmt.lineno, stmt.end_lineno + 1))
        spans.update(dict.fromkeys(lines, lines))  # the smaller statements last: the innermost kept
    return spans
