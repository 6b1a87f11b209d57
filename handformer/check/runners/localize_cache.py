"""Where a model's cached decoding parts from its own decoding without a cache: the learner's code run
twice, on the whole sequence without a cache (which matched the reference), and on a prefix then the
rest through the cache; each tensor a line of theirs makes on the cached path is compared with the
same line's tensor on the whole sequence, at the positions the call covers. The first that differs is
the departure (a causal mask not offset by the start, a rotary table read from position 0).

Shape legend: T the whole sequence's length; a call covers positions a..b-1."""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.localize import Departure, Step, statement, trace_steps
from handformer.check.core.result import text


def _aligned(whole: Tensor, part: Tensor, T: int, a: int, b: int) -> Tensor:
    """The whole run's tensor at the positions a call over a..b-1 covers (the queries a..b-1, the
    keys 0..b-1 it sees); the part itself where the shapes do not line up so (nothing to judge)."""
    index = [dict([(b - a, slice(a, b)), (b, slice(0, b))] * (full == T) + [(full, slice(None))]).get(got)
             for full, got in zip(whole.shape, part.shape)]  # a size of T is cut to the call's positions
    return whole[tuple(index)] if None not in index and whole.dim() == part.dim() else part


def cache_departure(whole: Callable[[], Any], calls: list[tuple[Callable[[], Any], int, int]], T: int,
                    filename: str) -> Departure | None:
    """The first tensor a line makes on the cached path (`calls`: each run with the positions a..b-1
    it covers) that differs from that line's on the whole sequence (`whole`)."""
    reference = _by_occurrence(trace_steps(whole, filename, every=True))
    for run, a, b in calls:
        steps = list(_by_occurrence(trace_steps(run, filename, every=True)).items())
        for i, (key, step) in enumerate(steps):
            want = _aligned(reference.get(key, step).value, step.value, T, a, b)
            if not torch.allclose(step.value, want, atol=1e-6, equal_nan=True):
                form = text(f"on the cached call over positions {a}..{b - 1}; the whole sequence's value "
                            "there differs",
                            f"出现在用缓存的调用里（位置 {a}..{b - 1}）；整句计算时那里的值不同")
                return _from_cache(steps[:i], reference, step, filename, form)
    return None


def _from_cache(before: list[tuple[tuple[int, str, int], Step]], reference: dict[Any, Step], step: Step,
                filename: str, form: Any) -> Departure:
    """The departure at `step`, or, when a value its line reads came from a line that only the cached
    path runs (`k, v = cache.update(...)`), at the line of that helper which writes what it returned
    there (`self.v[layer][...] = k`), called from that line."""
    used = set(re.findall(r"\w+", statement(filename, step.line))) | {step.name}  # what its line reads
    origin = next((s for key, s in reversed(before) if s.name in used and key not in reference), None)
    written = _written_line(filename, origin)
    if written is None:
        return Departure(step.line, step.name, statement(filename, step.line), form)
    return Departure(written, step.name, statement(filename, written), form,
                     called_from=(origin.line, statement(filename, origin.line)))


def _written_line(filename: str, origin: Step | None) -> int | None:
    """For `a, b = obj.method(...)` at the origin's line, the line of the file's `method` that writes
    into the buffer it returns as the origin's name (its `return self.k[...], self.v[...]`: the line
    `self.v[...] = ...`); None where the code is not so."""
    nodes = list(ast.walk(ast.parse(Path(filename).read_text(encoding="utf-8"))))
    try:  # the statement at that line comes first in the walk, before the nodes inside it
        call = next(n for n in nodes if getattr(n, "lineno", 0) == origin.line)
        names = [ast.unparse(t) for t in call.targets[0].elts]
        method = next(f for f in nodes if getattr(f, "name", None) == call.value.func.attr)
        buffer = _base(method.body[-1].value.elts[names.index(origin.name)])  # its return statement
        return next(n.lineno for n in method.body if _base(getattr(n, "targets", [n])[0]) == buffer)
    except (AttributeError, IndexError, ValueError, StopIteration):  # not a helper that returns its buffers
        return None


def _base(node: ast.AST) -> str:
    """`self.v` for `self.v[layer][:, :, :n]`: the expression under the subscripts."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return ast.unparse(node)


def _by_occurrence(steps: list[Step]) -> dict[tuple[int, str, int], Step]:
    """Each step by (line, name, how many times that line made that name before): one layer's step
    lines up with the same layer's on the other run."""
    seen: Counter[tuple[int, str]] = Counter()
    out = {}
    for s in steps:
        out[(s.line, s.name, seen[(s.line, s.name)])] = s
        seen[(s.line, s.name)] += 1
    return out
