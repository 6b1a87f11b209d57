"""The one-cycle schedule (Smith's 1cycle; torch.optim.lr_scheduler.OneCycleLR, fastai's
fit_one_cycle): from max_lr / div_factor up to max_lr over a fraction pct_start of the run, then down
to max_lr / div_factor / final_div_factor at its end, each phase half a cosine (or a straight line
where the code computes no cosine: anneal_strategy='linear').

Told from the other schedules by what it takes: a warmup given as a fraction of the run (pct_start)
and the divisors of the peak. Read at STEPS and compared under two counting conventions, never failed:
torch's (the peak at step pct_start * total - 1, the floor at step total - 1) and fastai's (the
position step / total: the peak at pct_start * total, the floor at total). Where neither matches, the
warmup off by one and the floor left out are tried, and named at the line that writes them.
"""

from __future__ import annotations

import inspect
import itertools
import math
import re
from collections.abc import Callable
from typing import Any

import torch

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import ONE_CYCLE_ARGS as ARGS
from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component
from handformer.check.core.result import Check, ComponentResult, Finding, Text, text
from handformer.check.core.source import first_line, locate, source_lines

SIZES = {"total": 100, "max_lr": 1.0, "fraction": 0.3, "div": 25.0, "final_div": 1e4}
STEPS = (0, 1, 2, 5, 10, 20, 28, 29, 30, 31, 40, 60, 80, 97, 98, 99)
# (the peak's step less pct_start * total, the floor's step less total), by convention
CONVENTIONS: dict[str, tuple[int, int, Text]] = {
    "torch": (-1, -1, text("the peak at step pct_start * total - 1, the floor at the last step, total - 1 "
                           "(torch.optim.lr_scheduler.OneCycleLR)",
                           "峰值在步 pct_start * total - 1，最低点在最后一步 total - 1"
                           "（torch.optim.lr_scheduler.OneCycleLR）")),
    "fastai": (0, 0, text("the peak at step pct_start * total, the floor at step total (fastai's "
                          "fit_one_cycle: the position step / total)",
                          "峰值在步 pct_start * total，最低点在步 total（fastai 的 fit_one_cycle："
                          "位置为 step / total）")),
}
# the named mistakes: (the peak's shift, the floor kept)
MISTAKES = {"": (0, True), "schedule_warmup_off_by_one:early": (-1, True),
            "schedule_warmup_off_by_one:late": (1, True), "cosine_min_lr_ignored": (0, False)}
SHAPES: dict[str, Callable[[float, float, float], float]] = {
    "cosine": lambda a, b, p: b + (a - b) / 2.0 * (math.cos(math.pi * p) + 1),
    "linear": lambda a, b, p: a + (b - a) * p,
}
READ_SHAPES = {True: ("cosine",), False: ("linear", "cosine")}  # by whether the code computes a cos
SHAPE_WORDS = {"cosine": ("half a cosine each", "半个余弦"), "linear": ("a straight line each", "直线")}


def takes_one_cycle(fn: Any) -> dict[str, str] | None:
    """The names it takes the warmup's fraction and the peak's divisors under (key -> name), where it
    takes all three; else None."""
    lowered = {n.lower(): n for n in inspect.signature(fn).parameters}
    found = {key: lowered.get(max(lowered.keys() & set(names), default="")) for key, names in ARGS.items()}
    return found if all(found.values()) else None  # type: ignore[return-value]


def one_cycle(t: float, convention: str, shape: str, mistake: str = "") -> float:
    """The rate at step t under `convention`, each phase `shape`, with the named mistake."""
    shift, floored = MISTAKES[mistake]
    peak_at, end_at, _ = CONVENTIONS[convention]
    total, hi = SIZES["total"], SIZES["max_lr"]
    low = hi / SIZES["div"]
    floor = low / SIZES["final_div"] * floored  # 0 where the floor is left out
    peak = SIZES["fraction"] * total + peak_at + shift
    end = total + end_at
    if t <= peak:
        return SHAPES[shape](low, hi, t / peak)
    return SHAPES[shape](hi, floor, (t - peak) / (end - peak))


def check_one_cycle(comp: Component, ctx: Context, step_name: str, names: dict[str, str],
                    reached: str) -> ComponentResult:
    """The learner's one-cycle schedule at STEPS against each convention, then the named mistakes."""
    res = ctx.result(comp)
    given = {names[k]: v for k, v in SIZES.items() if k in names}
    got = {s: float(ctx.learner.call("forward", comp.obj, **{step_name: s}, **given)) for s in STEPS}
    shapes = READ_SHAPES[re.search(r"(?i)\bcos", reached) is not None]
    readings = list(itertools.product(MISTAKES, CONVENTIONS, shapes))
    errors = {r: _error(got, r) for r in readings}
    mistake, convention, shape = min(readings, key=lambda r: (errors[r] >= fp.REL_TOL, bool(r[0]), errors[r]))
    right = errors[("", convention, shape)]
    res.max_abs_error = max(abs(got[s] - one_cycle(s, convention, shape)) for s in STEPS)
    shown, steps = ", ".join(f"{k} {v:g}" for k, v in given.items()), ", ".join(map(str, STEPS))
    res.checks.append(Check(
        text(f"the learning rate at steps {steps} equals the one-cycle schedule ({shown}; warmup and "
             f"anneal {SHAPE_WORDS[shape][0]})",
             f"步 {steps} 的学习率等于单周期调度（{shown}；预热和退火都是{SHAPE_WORDS[shape][1]}）"),
        right < fp.REL_TOL, text(f"largest relative difference {right:.2e}", f"最大相对误差 {right:.2e}")))
    res.convention = (None, CONVENTIONS[convention][2])[right < fp.REL_TOL]
    if errors[(mistake, convention, shape)] < fp.REL_TOL <= right:  # a mistake explains it, nothing else
        res.findings.append(_finding(comp, mistake.split(":")[0], names["fraction"], right))
    return finish(res)


def _error(got: dict[int, float], reading: tuple[str, str, str]) -> float:
    """The largest relative difference of the learner's rates from one reading's (inf: not finite)."""
    mistake, convention, shape = reading
    want = torch.tensor([one_cycle(s, convention, shape, mistake) for s in got], dtype=torch.float64)
    value = torch.tensor(list(got.values()), dtype=torch.float64)
    return float(((value - want).abs() / want.abs().clamp(min=1e-12)).nan_to_num(math.inf).max())


def _finding(comp: Component, name: str, fraction: str, error: float) -> Finding:
    """The mistake at its line: the warmup's end where the code scales the fraction by the run (the
    line that names pct_start and computes with it); the floor left out in the anneal, the last line
    that returns; else where the catalogue's patterns find it."""
    lines = source_lines([comp.obj])
    scaled = rf"\b{re.escape(fraction)}\b\s*\*|\*\s*{re.escape(fraction)}\b"
    number, code = (first_line([scaled], lines) if name == "schedule_warmup_off_by_one"
                    else first_line([r"\breturn\b"], lines[::-1]))  # the anneal: the last phase returned
    if number is None:
        number, code = locate(name, lines)
    observed = text(f"your rates equal the one-cycle schedule's with this mistake; they differ from it by "
                    f"up to {error:.2e} (relative)",
                    f"你的学习率等于带这个错误的单周期调度；与正确的最多相差 {error:.2e}（相对）")
    return Finding(name, observed, number, code)
