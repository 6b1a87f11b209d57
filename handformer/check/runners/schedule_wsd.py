"""The warmup-stable-decay schedule (WSD: MiniCPM's, Hugging Face's `get_wsd_schedule`): a linear
warmup to the peak, the peak held through a stable stage, a short decay down to a floor, the floor
after it. Its documented variants are searched, never failed: the warmup from the floor (Hugging
Face, MiniCPM) or from 0, t / T_w of the way (or (t + 1) / T_w where the code writes step + 1),
and the decay's shape (a straight
line, half a cosine, 1 - sqrt, MiniCPM's exponential max_lr * (floor / max_lr)^progress, or an
exponential above the floor, floor + (max_lr - floor) * r^progress, r read from the learner's rates).
schedule.py reads the learner's schedule; this file is the reference.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable

from torch import Tensor

from handformer.check.core.argument_names import SCHEDULE_ARGS
from handformer.check.core.result import Text, text
from handformer.check.reference import variants as V

# the step is 0-based: the warmup ends at step 10, the stable stage at 40, the decay at 60
SIZES = {"max_lr": 1.0, "min_lr": 0.1, "warmup": 10, "stable": 30, "decay": 20}
STEPS = (0, 1, 2, 5, 8, 9, 10, 11, 20, 39, 40, 41, 45, 50, 55, 59, 60, 61, 80)
FLAGS = ("schedule_warmup_off_by_one:early", "schedule_warmup_off_by_one:late")

# progress p through the decay (0 to 1), the peak and the floor -> the learning rate
SHAPES: dict[str, Callable[[float, float, float], float]] = {
    "linear": lambda p, hi, lo: lo + (hi - lo) * (1.0 - p),
    "cosine": lambda p, hi, lo: lo + (hi - lo) * 0.5 * (1.0 + math.cos(math.pi * p)),
    "1-sqrt": lambda p, hi, lo: lo + (hi - lo) * (1.0 - math.sqrt(p)),
    "exp": lambda p, hi, lo: hi * (lo / hi) ** p,
}
SHAPE_NAMES = {"linear": ("a straight line", "直线"), "cosine": ("half a cosine", "半个余弦"),
               "1-sqrt": ("1 - sqrt(progress)", "1 - sqrt(progress)"),
               "exp": ("max_lr x (floor / max_lr)^progress (MiniCPM)",
                       "max_lr × (floor / max_lr)^progress（MiniCPM）")}


def wsd(t: int, floor: float, start: float, shape: Callable[[float, float, float], float],
        flags: frozenset[str] = frozenset(), count: int = 0) -> float:
    """The rate at step t: from `start` (the floor, or 0) up to max_lr over the warmup, in the form
    WARMUP_FORMS[count] (count 1: (t + 1) / T_w, the peak one step early; 2: nanoGPT's
    (t + 1) / (T_w + 1)), max_lr through the
    stable stage, down to `floor` along `shape` over the decay, `floor` after it; with the warmup off
    by one when flagged."""
    hi, warmup = SIZES["max_lr"], SIZES["warmup"]
    w = V.warmup_with(warmup, flags)
    stable_end = warmup + SIZES["stable"]
    if t < w:
        shift, widen = WARMUP_FORMS[count]
        return start + (hi - start) * (t + shift) / (w + widen)
    if t < stable_end:
        return hi
    progress = min((t - stable_end) / SIZES["decay"], 1.0)
    return shape(progress, hi, floor)


def total(name: str | None) -> int:
    """The `total` a WSD is given: the decay's length where the setting is named for it
    (`decay_steps`, a cosine's end elsewhere), else the whole run's."""
    decay = SIZES["decay"]
    return decay if str(name).lower() in SCHEDULE_ARGS["decay"] else SIZES["warmup"] + SIZES["stable"] + decay


HALF_WAY = SIZES["warmup"] + SIZES["stable"] + SIZES["decay"] // 2  # the step half-way through the decay
WARMUPS = {0: ("t / T_w", "t / T_w"), 1: ("(t + 1) / T_w", "(t + 1) / T_w"),
           2: ("(t + 1) / (T_w + 1) (nanoGPT)", "(t + 1) / (T_w + 1)（nanoGPT）")}
# each warmup's (shift of t, of T_w) in its ratio: the cosine's three (schedule.COSINE_CONVENTIONS)
WARMUP_FORMS = {0: (0, 0), 1: (1, 0), 2: (1, 1)}
# code that counts its step from 1, `(step + 1)`: its warmup (t + 1) / T_w is searched, which a floor of
# 1 / T_w would otherwise make one with the warmup a step short
COUNTED = re.compile(r"\(\s*\w+\s*\+\s*1\s*\)")


def conventions(floor: float, got: dict[int, float] | None = None, counts: tuple[int, ...] = (0,),
                ) -> tuple[dict[str, Callable[[int, frozenset[str]], float]], dict[str, Text]]:
    """The documented variants to the floor `floor` (a convention each, taking the step and the
    mistakes), and their labels; the exponential decays only to a floor above 0."""
    out: dict[str, Callable[[int, frozenset[str]], float]] = {}
    labels: dict[str, Text] = {}
    shapes = {name: (SHAPES[name], SHAPE_NAMES[name]) for name in SHAPES if name != "exp" or floor > 0}
    shapes.update(_exponential(floor, got or {}))
    for start, (en, zh) in ((floor, ("from the floor", "从下限开始")), (0.0, ("from 0", "从 0 开始"))):
        for count, (name, shape) in itertools.product(counts, shapes.items()):
            key = f"{name}:{start}:{count}"
            out[key] = lambda t, f, fn=shape[0], start=start, count=count: wsd(t, floor, start, fn, f, count)
            warm, warm_zh = (sep + words if count else "" for sep, words in zip((", ", "，"), WARMUPS[count]))
            labels[key] = text(f"WSD: warmup {en}{warm}, the decay {shape[1][0]}",
                               f"WSD：预热{zh}{warm_zh}，衰减为{shape[1][1]}")
    return out, labels


Shape = tuple[Callable[[float, float, float], float], tuple[str, str]]  # the decay, and its words


def _exponential(floor: float, got: dict[int, float]) -> dict[str, Shape]:
    """The decay exponential above the floor, floor + (max_lr - floor) * r^progress (the MiniCPM
    paper's halvings, 0.5^(progress / h)), its r read from the rate half-way through the decay, where
    that is between the floor and the peak and r ends the decay within 1% of the gap."""
    hi, half = SIZES["max_lr"], float(got.get(HALF_WAY, math.nan))
    r = max((half - floor) / (hi - floor), 0.0) ** 2
    if not 0 < r <= 0.01:  # NaN: none
        return {}
    words = (f"floor + (max_lr - floor) x {r:.3g}^progress, exponential above the floor",
             f"下限 + (max_lr - 下限) × {r:.3g}^progress，在下限之上指数衰减")
    return {"exp-floor": (lambda p, hi, lo: lo + (hi - lo) * r ** p, words)}


def sub_steps(s: Tensor, rates: Tensor) -> list[tuple[str, Tensor]]:
    """The reference's sub-steps at the steps s (S,), by name, in order (localize_schedule.py)."""
    stable_end = SIZES["warmup"] + SIZES["stable"]
    return [("the step t", s), ("the warmup fraction t / T_w", s / SIZES["warmup"]),
            ("the steps into the decay", s - stable_end),
            ("the progress through the decay", (s - stable_end) / SIZES["decay"]), ("the rate", rates)]
