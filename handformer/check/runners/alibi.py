"""ALiBi's slopes (Press et al., "Train Short, Test Long"): a function of the number of heads that gives
each head's slope, 2^(-8 h / n) for the heads h = 1 .. n (MPT's `gen_slopes(n_heads, alibi_bias_max=8)`,
the paper's `get_slopes(n)`), or the bias it builds, slope * key position (BLOOM's
`build_alibi_tensor(attention_mask, num_heads, dtype)`, read as slopes by the step from position 0 to 1).
Compared with handformer's for 4, 8 and 16 heads, and for 6: not a power of two, where the paper, BLOOM
and MPT give the heads past 4 every other slope of 8 (a plain 2^(-8 h / 6) is a convention, noted).

Shape legend: H heads, S key positions.
"""

from __future__ import annotations

import inspect
import math
import re
from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish, forward_parameters
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.localize import Departure, View, first_departure, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.reference import variants as V

HEADS = (4, 8, 16, 6)  # 6: the heads past a power of two take their own slopes
S = 5
# what a slopes function is handed, by its argument's name (its first argument, named none of these, is
# the number of heads): a mask or ids of S real tokens, a length of S, a device, a dtype
GIVEN: tuple[tuple[str, Any], ...] = (
    (r"head", lambda n: n), (r"device", lambda n: "cpu"), (r"dtype", lambda n: torch.float64),
    (r"mask|ids", lambda n: torch.ones(1, S, dtype=torch.long)), (r"len|pos", lambda n: S))


def check_alibi_slopes(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    params = forward_parameters(comp.obj)[1:]
    unfilled = [p.name for p in params if not _role(p.name, p.default is not p.empty)]  # required, no role
    cannot_fill(comp.name, unfilled, (), [comp.name], "n_heads", (
        "the slopes' function takes the number of heads, a mask or a length, its other settings with "
        "defaults", "斜率函数接收头数、掩码或长度，其他设置要有默认值"))
    errors = {n: _error(res, _slopes(ctx, comp, n), n) for n in HEADS}
    res.max_abs_error = max(errors.values())
    res.checks.append(Check(text("each head's slope 2^(-8h/n), h = 1..n, for 4, 8 and 16 heads, and for 6 "
                                 "the paper's (every other slope of 8 for the heads past 4)",
                                 "4、8、16 个头时，每个头的斜率都是 2^(-8h/n)，h = 1..n；6 个头时按论文的写法"
                                 "（4 之后的头取 8 个头的斜率中隔一个取一个）"),
                            res.max_abs_error < 1e-6, error_text(res.max_abs_error)))
    if res.max_abs_error >= 1e-6:
        n = min(HEADS, key=lambda m: errors[m] < 1e-6)  # the first that errs: a power of two first
        note_departure(res, lambda: localize_slopes(comp.obj, n))
    return finish(res)


def _role(name: str, fallback: bool) -> Any:
    """The filler of an argument by its name; for a name none of GIVEN's: the number of heads where
    `fallback`, else None."""
    return next((fill for pattern, fill in GIVEN if re.search(pattern, name.lower())),
                [None, lambda n: n][fallback])


def _error(res: ComponentResult, slopes: Tensor, n: int) -> float:
    """How far the slopes are from the paper's for n heads; a plain 2^(-8h/n) for n not a power of two
    is a convention, noted."""
    error = fp.max_error(slopes, V.alibi_slopes(n))
    plain = 2 ** (-8 * torch.arange(1, n + 1, dtype=torch.float64) / n)
    if error >= 1e-6 and fp.max_error(slopes, plain) < 1e-6:
        res.convention = text(f"2^(-8h/n) for every head count ({n} heads too), not the paper's "
                              "interleaved slopes past a power of two",
                              f"任何头数都用 2^(-8h/n)（{n} 个头也是），不是论文在 2 的幂之后交错取的斜率")
        return 0.0
    return error


def _given(fn: Any, n: int) -> dict[str, Any]:
    """The arguments of a slopes function for n heads: each required one and each a role fills."""
    fills = {p.name: _role(p.name, p.default is p.empty) for p in forward_parameters(fn)}
    return {name: fill(n) for name, fill in fills.items() if fill}


def _slopes(ctx: Context, comp: Component, n: int) -> Tensor:
    """The learner's slopes for n heads, flattened to (H,) (MPT's are (1, H, 1, 1)); from a bias of
    slope * position (H * S numbers), the step from position 0 to 1."""
    out = torch.as_tensor(ctx.learner.call("forward", comp.obj, **_given(comp.obj, n))).double()
    if out.numel() not in (n, n * S):
        raise ctx.learner.fail("forward", f"{comp.name} for {n} heads gave {tuple(out.shape)}: neither {n} "
                               f"slopes nor a bias of {n} x {S} positions",
                               f"{comp.name} 在 {n} 个头时给出 {tuple(out.shape)}：既不是 {n} 个斜率，"
                               f"也不是 {n} x {S} 个位置的偏置")
    rows = out.reshape(n, -1)  # (H, 1) or (H, S)
    return rows[:, 1] - rows[:, 0] if rows.size(1) == S else rows[:, 0]


def slope_views(n: int) -> list[View]:
    """The slopes' sub-steps for n heads: the heads 1..n, their exponents 8h/n, the powers 2^(8h/n),
    the slopes and MPT's (1, H, 1, 1) of them; for n not a power of two, those of the powers of two
    p below and 2p above it too, the odd powers 1, 3, .. of 2p's base and the slopes they give (the
    paper's and BLOOM's), the odd and even heads of 2p (MPT's), and the bias slope * position (H, 1, S)."""
    p = 2 ** math.floor(math.log2(n))
    views = [view for m in (n, p, 2 * p)[: 1 + 2 * (n != p)] for view in _plain_views(m)]
    odd = torch.arange(1, max(2 * (n - p), 1), 2, dtype=torch.float64)  # (H - p,) the odd powers 1, 3, ..
    slopes = V.alibi_slopes(n)
    extra = [("the base 2^(-8/(2p))", torch.tensor(2 ** (-8 / (2 * p)))), ("the odd powers 1, 3, ..", odd),
             ("the slopes of the heads past p", slopes[p:]), ("the slopes of 2p's odd heads", slopes[1::2]),
             ("the slopes of 2p's even heads", V.alibi_slopes(2 * p)[::2])]
    bias = slopes[:, None, None] * torch.arange(S, dtype=torch.float64)  # (H, 1, S)
    return views + extra * (n != p) + [("the bias slope * position", bias)]


def _plain_views(n: int) -> list[View]:
    """The steps of 2^(-8h/n) for the heads h = 1..n."""
    heads = torch.arange(1, n + 1, dtype=torch.float64)  # (H,)
    exponents = heads * 8 / n
    slopes = 2 ** -exponents
    return [(f"the heads 1 .. {n}", heads), (f"the exponents 8h/{n}", exponents),
            (f"2^(8h/{n})", 2 ** exponents), (f"the exponents -8h/{n}", -exponents),
            (f"the slopes 2^(-8h/{n})", slopes), (f"the base 2^(-8/{n})", torch.tensor(2 ** (-8 / n))),
            (f"the slopes (1, {n}, 1, 1)", slopes.view(1, n, 1, 1))]


def localize_slopes(fn: object, n: int) -> Departure | None:
    """Run the learner's slopes function for n heads traced, each tensor it makes a step: the first step
    that is none of the slopes' sub-steps."""
    filename = inspect.getsourcefile(fn)
    steps = trace_steps(lambda: fn(**_given(fn, n)), filename, every=True, lists=True)
    return first_departure(steps, slope_views(n), filename, {"n_heads": n})
