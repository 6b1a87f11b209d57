"""Where a learning-rate schedule of plain numbers parts from the reference, when no catalogued
mistake explains it. The schedule runs once more at each step, traced: each number a line of it binds
(and what it returns) is a step, its values over the steps where that line runs. The reference's
sub-steps are numbers of the step too (the warmup fraction, the progress through the decay, π times
it, its cosine, the cosine factor, the paper's two terms, ...). At the first step where the rate is
wrong, the first number bound that is none of the sub-steps there, and was one at each step where
the rate was right, is where the schedule parts; its line is quoted, and inside it the smallest
expression that parts (evaluated from the line's syntax on the same values). Its form, where it is
simple: a constant factor (a size, π), the step off by one, a constant or a sub-step added.
"""

from __future__ import annotations

import ast
import functools
import linecache
import math
import sys
from collections.abc import Callable
from typing import Any

from handformer.check.core.localize import Departure, factor_name, statement
from handformer.check.core.result import Text, text

Values = dict[int, float]  # step -> value
Views = Callable[[int], dict[str, float]]  # step -> the reference's sub-steps there, by name


class Bound:
    """The numbers one run of the schedule binds: (line, name, value) in order, and the locals before
    each line runs (to evaluate that line's expressions)."""

    def __init__(self, code: Any) -> None:
        self.code, self.numbers, self.before = code, [], {}
        self.frame_globals: dict[str, Any] = {}
        self.seen: dict[str, Any] | None = None
        self.line = 0

    def local(self, frame: Any, event: str, arg: Any) -> Any:
        now = {k: v for k, v in frame.f_locals.items()}
        if self.seen is not None:  # after the arguments: what the line that ran bound
            self.numbers += [(self.line, k, _number(v)) for k, v in now.items()
                             if _number(v) is not None and (k not in self.seen or self.seen[k] is not v)]
        if event == "return" and _number(arg) is not None:
            self.numbers.append((frame.f_lineno, "return", _number(arg)))
        self.seen, self.line, self.frame_globals = now, frame.f_lineno, frame.f_globals
        self.before.setdefault(frame.f_lineno, now)
        return self.local

    def tracer(self, frame: Any, event: str, arg: Any) -> Any:
        return self.local if frame.f_code is self.code else None


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) and getattr(v, "numel", lambda: 0)() != 1:
        return None
    try:
        return float(v)
    except (TypeError, ValueError, RuntimeError):
        return None


def bound_at(run: Callable[[], Any], code: Any) -> Bound:
    """Run the schedule at one step (`run`), tracing the frames of `code`."""
    bound, old = Bound(code), sys.gettrace()
    sys.settrace(bound.tracer)
    try:
        run()
    finally:
        sys.settrace(old)
    return bound


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _named(values: Values, views: Views) -> str | None:
    """The sub-step these values are at each of their steps, or None."""
    names = None
    for s, v in values.items():
        here = {n for n, r in views(s).items() if _close(v, r)}
        names = here if names is None else names & here
    return next(iter(sorted(names)), None) if names else None


def departing(runs: dict[int, Bound], views: Views, wrong: int, right: set[int]) -> tuple[int, str] | None:
    """The first (line, name) bound at step `wrong` that is none of the sub-steps there and was one at
    each step of `right` where it was bound; else the first that is none of them there; None: none."""
    by_key: dict[tuple[int, str], Values] = {}
    for s, bound in runs.items():
        for line, name, v in bound.numbers:
            by_key.setdefault((line, name), {})[s] = v
    order = list(dict.fromkeys((line, name) for line, name, _ in runs[wrong].numbers))
    off = [k for k in order if _named({wrong: by_key[k][wrong]}, views) is None
           and len(set(by_key[k].values())) > 1]  # a number that varies with the step
    kept = [k for k in off if _named({s: v for s, v in by_key[k].items() if s in right}, views) or not (
        right & by_key[k].keys())]
    return next(iter(kept or off), None)


def _expressions(line: str) -> list[ast.expr]:
    """The expressions of a statement's right-hand side, the innermost first."""
    try:
        tree = ast.parse(line.strip().removeprefix("return ").strip() if line.strip().startswith("return")
                         else line.strip().split("=", 1)[-1].strip(), mode="eval")
    except SyntaxError:
        return []
    return sorted((n for n in ast.walk(tree.body) if isinstance(n, (ast.Call, ast.BinOp, ast.UnaryOp))),
                  key=lambda n: len(ast.unparse(n)))


def _evaluate(node: ast.expr, bound: Bound, line: int) -> float | None:
    try:
        return _number(eval(compile(ast.Expression(node), "<schedule>", "eval"),  # noqa: S307 - their line
                            bound.frame_globals, dict(bound.before.get(line, {}))))
    except Exception:  # noqa: BLE001 - an expression that cannot run alone
        return None


def inner_departure(runs: dict[int, Bound], views: Views, line: int, code: str, steps: set[int],
                    ) -> tuple[str, Values] | None:
    """The smallest expression of the line that is none of the sub-steps at the steps given (and the
    values it takes at every step the line ran)."""
    for node in _expressions(code):
        values = {s: _evaluate(node, b, line) for s, b in runs.items() if line in b.before}
        values = {s: v for s, v in values.items() if v is not None}
        if values and len(set(values.values())) > 1 and _named({s: values[s] for s in steps & values.keys()},
                                                              views) is None:
            return ast.unparse(node), values
    return None


def form(values: Values, views: Views, sizes: dict[str, float]) -> Text | None:
    """The simple form of values that are none of the sub-steps: a constant factor, the step off by
    one, a constant added, a function of a sub-step."""
    names = list(views(next(iter(values))))
    refs = {name: {s: views(s)[name] for s in values} for name in names}
    factors = [f for f in (_factor(values, refs[name], name, sizes) for name in names) if f]
    named = [f for f, simple in factors if simple]  # a factor that is a size or a whole number first
    return next(iter(named), None) or next((found for name in names for found in (
        _shifted(values, views, name), _offset(values, refs[name], name)) if found), None) or next(
        (f for f, _ in factors), None) or _function_of(values, views, names)


def _factor(values: Values, ref: Values, name: str, sizes: dict[str, float]) -> tuple[Text, bool] | None:
    """values = c × the sub-step `name`: its form, and whether c is simple (a size, a whole number)."""
    ratios = {v / ref[s] for s, v in values.items() if abs(ref[s]) > 1e-12}
    c = next(iter(ratios), None)
    if c is None or not all(_close(r, c) for r in ratios) or _close(c, 1.0):
        return None
    called = factor_name(c, sizes)
    named = f" = {called}" if called != f"{c:.4g}" else ""
    simple = bool(named) or any(_close(c, n) or _close(c, 1 / n) for n in range(2, 11))
    return text(f"{name} times a constant factor {c:.4g}{named}",
                f"{name} 乘了一个常数因子 {c:.4g}{named}"), simple


def _shifted(values: Values, views: Views, name: str) -> Text | None:
    for d, sign in ((1, "+"), (-1, "-")):
        if all(_close(v, views(s + d)[name]) for s, v in values.items()):
            return text(f"{name} of step t {sign} 1: the step is counted off by one",
                        f"是步 t {sign} 1 的{name}：步数差了一")
    return None


def _offset(values: Values, ref: Values, name: str) -> Text | None:
    diffs = [v - ref[s] for s, v in values.items()]
    if len(diffs) > 1 and all(_close(d, diffs[0]) for d in diffs) and not _close(diffs[0], 0.0):
        return text(f"{name} plus a constant {diffs[0]:.4g}", f"{name} 多加了一个常数 {diffs[0]:.4g}")
    return None


FUNCTIONS = (("cos", math.cos), ("sin", math.sin), ("exp", math.exp), ("sqrt", math.sqrt))


def _function_of(values: Values, views: Views, names: list[str]) -> Text | None:
    for (f, fn), name in ((f, n) for f in FUNCTIONS for n in names):
        try:
            if all(_close(v, fn(views(s)[name])) for s, v in values.items()):
                return text(f"{f}({name}), none of the reference's sub-steps",
                            f"{f}({name})，不是参考的任何一个中间结果")
        except ValueError:
            continue
    return None


def localize_schedule(value_at: Callable[[int], Any], fn: Any, views: Views, got: Values, right: Values,
                      sizes: dict[str, float]) -> Departure | None:
    """Run the schedule (`value_at(step)`) at each step traced: the first number it binds that parts
    from the reference's sub-steps at the first step its rate is wrong (see `departing`), its line
    and the form of the smallest expression there that parts."""
    code = getattr(fn, "__code__", None)
    wrong = next((s for s in sorted(got) if not _close(got[s], right[s])), None)
    if code is None or wrong is None:
        return None
    runs = {s: bound_at(functools.partial(value_at, s), code) for s in sorted(got)}
    at = departing(runs, views, wrong, {s for s in got if _close(got[s], right[s])})
    if at is None:
        return None
    line, name = at
    filename = code.co_filename
    inner = inner_departure(runs, views, line, linecache.getline(filename, line), {wrong})
    values = inner[1] if inner else {s: v for s, b in runs.items() for ln, n, v in b.numbers if (ln, n) == at}
    found = form(values, views, sizes)
    if inner and found is not None:
        found = text(f"`{inner[0]}` is {found['en']}", f"`{inner[0]}` 是 {found['zh']}")
    elif inner:
        found = text(f"`{inner[0]}` is none of the reference's sub-steps",
                     f"`{inner[0]}` 不是参考的任何一个中间结果")
    return Departure(line, name, statement(filename, line), found)
