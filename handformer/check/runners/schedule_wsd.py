"""The warmup-stable-decay schedule (WSD: MiniCPM's, Hugging Face's `get_wsd_schedule`): a linear
warmup to the peak, the peak held through a stable stage, a short decay down to a floor, the floor
after it. Its documented variants are searched, never failed: the warmup from the floor (Hugging
Face, MiniCPM) or from 0, and the decay's shape (a straight line, half a cosine, 1 - sqrt, or
MiniCPM's exponential max_lr * (floor / max_lr)^progress). schedule.py reads the learner's schedule;
this file is the reference.
"""

from __future__ import annotations

import math
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


def wsd(t: int, floor: float, start: float, shape: str, flags: frozenset[str] = frozenset()) -> float:
    """The rate at step t: from `start` (the floor, or 0) up to max_lr over the warmup, max_lr through
    the stable stage, down to `floor` along `shape` over the decay, `floor` after it; with the warmup
    off by one when flagged."""
    hi, warmup = SIZES["max_lr"], SIZES["warmup"]
    w = V.warmup_with(warmup, flags)
    stable_end = warmup + SIZES["stable"]
    if t < w:
        return start + (hi - start) * t / w
    if t < stable_end:
        return hi
    progress = min((t - stable_end) / SIZES["decay"], 1.0)
    return SHAPES[shape](progress, hi, floor)


def total(name: str | None) -> int:
    """The `total` a WSD is given: the decay's length where the setting is named for it
    (`decay_steps`, a cosine's end elsewhere), else the whole run's."""
    decay = SIZES["decay"]
    return decay if str(name).lower() in SCHEDULE_ARGS["decay"] else SIZES["warmup"] + SIZES["stable"] + decay


def conventions(floor: float) -> tuple[dict[str, Callable[[int, frozenset[str]], float]], dict[str, Text]]:
    """The documented variants to the floor `floor` (a convention each, taking the step and the
    mistakes), and their labels; the exponential decay only to a floor above 0."""
    out: dict[str, Callable[[int, frozenset[str]], float]] = {}
    labels: dict[str, Text] = {}
    for start, (en, zh) in ((floor, ("from the floor", "从下限开始")), (0.0, ("from 0", "从 0 开始"))):
        for shape in (s for s in SHAPES if s != "exp" or floor > 0):
            key = f"{shape}:{start}"
            out[key] = lambda t, f, shape=shape, start=start: wsd(t, floor, start, shape, f)
            labels[key] = text(f"WSD: warmup {en}, the decay {SHAPE_NAMES[shape][0]}",
                               f"WSD：预热{zh}，衰减为{SHAPE_NAMES[shape][1]}")
    return out, labels


def sub_steps(s: Tensor, rates: Tensor) -> list[tuple[str, Tensor]]:
    """The reference's sub-steps at the steps s (S,), by name, in order (localize_schedule.py)."""
    stable_end = SIZES["warmup"] + SIZES["stable"]
    return [("the step t", s), ("the warmup fraction t / T_w", s / SIZES["warmup"]),
            ("the steps into the decay", s - stable_end),
            ("the progress through the decay", (s - stable_end) / SIZES["decay"]), ("the rate", rates)]
