"""A scheduler factory that takes no peak of its own multiplies the optimizer's rate: stepped on an
SGD with lr 2, its rates up to the peak (steps 1 .. T_w) are twice those with lr 1.

Check reads a factory's schedule on an optimizer of lr 1, where a `LambdaLR`'s multiplier and the rate
are the same number: a lambda that returns the rate itself (Hugging Face's polynomial decay returning
`decay`, not `decay / lr_init`) is invisible there. Read again at lr 2, the warmup and the peak (no
floor enters them: a floor given as a rate does not scale) must double. Where they do not, the line
the lambda returns from at the first step that does not is quoted. Read only where the rates at lr 1
are right: a schedule already wrong there is localized on them.
"""

from __future__ import annotations

import contextlib
import linecache
import math
import sys
from typing import Any

from handformer.check.core import fingerprint as fp
from handformer.check.core.probe import Found, Subject
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text

DOUBLED = 2.0  # the optimizer's lr of the second reading


def check_scale(res: ComponentResult, ctx: Any, comp: Any, subject: Subject, found: Found) -> None:
    """The probe's step: a factory with no peak argument, read again at lr 2 up to the peak."""
    sched = subject.module
    got = subject.facts["got"]
    warm = [s for s in sched.steps if 0 < s <= sched.sizes.get("warmup", 0) and isinstance(got.get(s), float)]
    wrong_already = res.findings or not all(c.ok for c in res.checks)  # its values at lr 1 said it
    if not sched.factory or sched.reads("max_lr") or not warm or wrong_already:
        return
    traced = sched.traced
    with contextlib.suppress(fp.LearnerFailure):  # it refuses lr 2 (a check of its own): not read
        doubled = sched.stepped(DOUBLED)
        lam = sched.traced[0]
        off = [s for s in warm if not math.isclose(doubled[s], DOUBLED * got[s], rel_tol=1e-6, abs_tol=1e-12)]
        res.checks.append(Check(text(
            f"stepped on an SGD with lr {DOUBLED:g}, the rates at steps 1..{warm[-1]} (the warmup and the "
            f"peak) are {DOUBLED:g} x those with lr 1: the schedule multiplies the optimizer's rate",
            f"在 lr 为 {DOUBLED:g} 的 SGD 上逐步调用，步 1..{warm[-1]}（预热和峰值）的学习率是 lr 为 1 时的 "
            f"{DOUBLED:g} 倍：调度乘的是优化器的学习率"), not off))
        if off and lam is not None:
            res.findings.append(_finding(lam, off[0], doubled[off[0]], DOUBLED * got[off[0]]))
    sched.traced = traced


def _finding(lam: Any, step: int, value: float, wanted: float) -> Finding:
    number = returned_at(lam, step)
    code = linecache.getline(lam.__code__.co_filename, number).strip() if number else None
    return Finding(DEPARTS, text(
        f"with lr {DOUBLED:g} the rate at step {step} is {value:.4g}, not {wanted:.4g}: the value returned "
        "here is not a multiplier of the optimizer's rate (LambdaLR multiplies the rate by it)",
        f"lr 为 {DOUBLED:g} 时步 {step} 的学习率是 {value:.4g}，不是 {wanted:.4g}：这里返回的值不是优化器"
        "学习率的倍数（LambdaLR 会再乘上学习率）"), number, code)


def returned_at(fn: Any, *args: Any) -> int | None:
    """The line `fn(*args)` returns from (traced; None where it raises)."""
    lines: list[int] = []

    def trace(frame: Any, event: str, _: Any) -> Any:
        if frame.f_code is not fn.__code__:
            return None
        if event == "return":
            lines.append(frame.f_lineno)
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        with contextlib.suppress(Exception):
            fn(*args)
    finally:
        sys.settrace(previous)
    return lines[-1] if lines else None
