"""timm's cosine schedule (`timm.scheduler.CosineLRScheduler`): a linear warmup from 0 over T_w
steps, then half a cosine over t_initial = T steps down to the floor, the floor after it (one cycle).
Its switch `warmup_prefix` says where the cosine counts from: False (its default) from step 0, the
warmup only overriding the cosine's first T_w steps; True from the warmup's end, the cosine ending at
T_w + T. A schedule with a switch that turns one counting into the other has both as documented
options: its default is a convention (schedule.py tries the switch), where a cosine counted from step
0 without one is the mistake cosine_from_step_zero.
"""

from __future__ import annotations

import math
from typing import Any

from handformer.check.core.result import text
from handformer.check.reference import variants as V

LABELS = {
    False: text("timm's counting (warmup_prefix=False): the cosine counts from step 0 over t_initial, "
                "the warmup t / T_w overriding its first steps",
                "timm 的计数（warmup_prefix=False）：余弦从步 0 开始数，长度 t_initial，"
                "前几步由预热 t / T_w 代替"),
    True: text("timm's counting (warmup_prefix=True): the cosine counts from the warmup's end over t_initial",
               "timm 的计数（warmup_prefix=True）：余弦从预热结束开始数，长度 t_initial"),
}


def timm_cosine(t: int, sizes: dict[str, Any], prefix: bool, flags: frozenset[str] = frozenset()) -> float:
    """The rate at step t counted as timm counts (`prefix`: warmup_prefix), with the cosine's mistakes
    (the warmup off by one, no floor past the end, min_lr left out of the cosine's formula)."""
    hi, warmup, total = sizes["max_lr"], sizes["warmup"], sizes["total"]
    w = V.warmup_with(warmup, flags)
    floor = 0.0 if "cosine_min_lr_ignored" in flags else sizes["min_lr"]
    if t < w:
        return hi * t / w
    progress = (t - warmup * prefix) / total
    if progress >= 1 and "cosine_no_floor" not in flags:
        return sizes["min_lr"]  # past its cycle: min_lr, in a branch of its own (min_lr_ignored or not)
    return floor + (hi - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def countings(values: dict[int, Any], sizes: dict[str, Any], universe: tuple[str, ...],
              ) -> set[tuple[bool, frozenset[str]]]:
    """The countings (warmup_prefix) and mistakes (none, or one of `universe`) the values are at
    every step."""
    def agrees(prefix: bool, flags: frozenset[str]) -> bool:
        right = (timm_cosine(t, sizes, prefix, flags) for t in values)
        return all(isinstance(v, float) and math.isclose(v, r, rel_tol=1e-6, abs_tol=1e-12)
                   for v, r in zip(values.values(), right))
    tried = [frozenset(), *map(frozenset, zip(universe))]
    return {(prefix, flags) for prefix in (False, True) for flags in tried if agrees(prefix, flags)}
