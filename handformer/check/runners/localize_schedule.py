"""Where a learning-rate schedule of plain numbers parts from the reference, when no catalogued
mistake explains it. The schedule runs once more at each step it is read at, traced (its numbers
too: `trace_steps(..., scalars=True)`): each number a line binds, and what it returns, is a step, its
values over the steps where that line runs. The reference's sub-steps are numbers of the step too
(the warmup fraction, the progress through the decay, π times it, its cosine, the cosine factor, the
paper's two terms, ...). At the first step where the rate is wrong, the first number bound that is
none of the sub-steps there, and was one sub-step at each step where the rate was right, is where the
schedule parts. Its line is quoted, and inside it the smallest expression that parts (evaluated from
the line's syntax on the same numbers), with its form where it is simple: a constant factor (a size,
π), the step counted off by one, a constant or a sub-step added, a cosine of another sub-step.

Shape legend: S the steps the schedule is read at.
"""

from __future__ import annotations

import ast
import functools
import linecache
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.defaults import quietly
from handformer.check.core.localize import (
    Departure,
    Form,
    Step,
    View,
    form_of,
    statement,
    trace_steps,
    view_zh,
)
from handformer.check.core.result import text

Views = Callable[[Tensor], list[View]]  # the steps (S,) -> the reference's sub-steps there, (S,) each


def _close(a: Tensor, b: Tensor) -> Tensor:
    return torch.isclose(a, b, rtol=1e-6, atol=1e-12)


def _table(runs: list[list[Step]], key: tuple[int, str], value: Callable[[Step], float]) -> Tensor:
    """(S,): a value of the step `key` binds in each run (`value` of it), NaN where it does not run."""
    out = torch.full((len(runs),), math.nan, dtype=torch.float64)
    for i, run in enumerate(runs):
        out[i] = next((value(s) for s in run if (s.line, s.name) == key), math.nan)
    return out


def departing(runs: list[list[Step]], refs: Tensor, wrong: Tensor) -> tuple[int, str] | None:
    """The first (line, name) bound at the first wrong step that is none of the sub-steps `refs`
    (views, S) there and was one sub-step at each right step where it was bound; else the first that
    is none of them there; None when every number there is a sub-step."""
    w = int(wrong.nonzero()[0])
    keys = list(dict.fromkeys((s.line, s.name) for s in runs[w] if not s.given))
    off, kept = [], []
    for key in keys:
        values = _table(runs, key, lambda s: float(s.value))  # (S,)
        seen = _close(values[None], refs)  # (views, S)
        bound = ~values.isnan()
        if not seen[:, w].any() and values[bound].unique().numel() > 1:  # it varies with the step
            off.append(key)
            kept += [key] * bool((seen | ~(bound & ~wrong)).all(1).any())
    return next(iter(kept + off), None)


def _expressions(code: str) -> list[ast.expr]:
    """The computed expressions of a statement (its right-hand side), the smallest first."""
    tree = quietly(lambda: ast.parse(code.strip()), SyntaxError, ast.Module([], []))  # (none found)
    found = (n for n in ast.walk(tree) if isinstance(n, (ast.Call, ast.BinOp, ast.UnaryOp)))
    return sorted(found, key=lambda n: len(ast.unparse(n)))


def _evaluated(node: ast.expr, step: Step, where: dict[str, Any]) -> float:
    """The expression on the numbers bound when the step was made (NaN when it cannot run alone)."""
    names = {name: value for name, (_, value) in step.numbers.items()}
    # nan: it needs what the line alone does not give
    return quietly(lambda: float(eval(compile(ast.Expression(node), "<schedule>", "eval"), where, names)),  # noqa: S307
                   Exception, math.nan)


def inner(runs: list[list[Step]], key: tuple[int, str], refs: Tensor, w: int, where: dict[str, Any],
          ) -> tuple[str, Tensor] | None:
    """The smallest expression of the line that varies with the step and is none of the sub-steps at
    step w: its code and its values (S,)."""
    for node in _expressions(linecache.getline(where["__file__"], key[0])):
        values = _table(runs, key, functools.partial(_evaluated, node, where=where))  # (S,)
        bound = ~values.isnan()
        if bound[w] and values[bound].unique().numel() > 1 and not _close(values[None, w], refs[:, w]).any():
            return ast.unparse(node), values
    return None


def _shifted(views: Views, steps: Tensor) -> list[Form]:
    """Each sub-step but the step itself (a constant added to it is an offset) one step on and one
    step back: a step counted off by one."""
    return [(text(f"{name} of step t {sign} 1: the step is counted off by one",
                  f"是步 t {sign} 1 的{view_zh(name)}：步数差了一"), r)
            for d, sign in ((1, "+"), (-1, "-")) for name, r in views(steps + d)[2:]]


def localize_schedule(value_at: Callable[[int], Any], fn: Any, views: Views, got: Tensor, right: Tensor,
                      steps: Tensor, sizes: dict[str, float]) -> Departure | None:
    """Run the schedule (`value_at(step)`) at each of the steps (S,) traced, with its rates `got` and
    the right ones (S,): the first number that parts at the first wrong step (see `departing`), its
    line and the form of the smallest expression there that parts (see `inner`)."""
    code, wrong = fn.__code__, ~_close(got, right)
    runs = [trace_steps(functools.partial(value_at, int(s)), code.co_filename, code, every=True, scalars=True)
            for s in steps]
    named = views(steps)[::-1]  # the latest sub-steps first: a factor of the rate before one of a term
    refs = torch.stack([r for _, r in named])  # (views, S)
    key = departing(runs, refs, wrong)  # none wrong: no step to start from, it raises (no note)
    if key is None:
        return None
    w = int(wrong.nonzero()[0])
    found = inner(runs, key, refs, w, {**fn.__globals__, "__file__": code.co_filename})
    values = found[1] if found else _table(runs, key, lambda s: float(s.value))
    bound = ~values.isnan()
    cosines = [(text(f"cos({n}), none of the reference's sub-steps",
                     f"cos({view_zh(n)})，不是参考的任何一个中间结果"), r.cos()) for n, r in named]
    forms = [(f, r[bound]) for f, r in _shifted(views, steps) + cosines]
    form = form_of(values[bound], [(n, r[bound]) for n, r in named], sizes, forms=forms)
    if found:
        form = form or FORMLESS
        space = " " * form["zh"][:1].isascii()  # 是 cos(...), 是余弦系数
        form = text(f"`{found[0]}` is {form['en']}", f"`{found[0]}` 是{space}{form['zh']}")
    return Departure(key[0], key[1], statement(code.co_filename, key[0]), form)


FORMLESS = text("none of the reference's sub-steps", "不是参考的任何一个中间结果")
