"""ALiBi's slopes (Press et al., "Train Short, Test Long"): a function of the number of heads that gives
each head's slope, 2^(-8 h / n) for the heads h = 1 .. n (MPT's `gen_slopes(n_heads, alibi_bias_max=8)`,
the paper's `get_slopes(n)`), compared with handformer's for 4, 8 and 16 heads: powers of two, where the
ways of BLOOM and MPT for the heads past a power of two (a convention each) do not come in.

Shape legend: H heads.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish, forward_parameters
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.localize import Departure, View, first_departure, trace_steps
from handformer.check.core.localize_kinds import note_departure
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.reference import variants as V

HEADS = (4, 8, 16)
# what a slopes function may require besides the number of heads (a `device`, a `dtype`): given so
GIVEN = {"device": "cpu", "dtype": torch.float64}


def check_alibi_slopes(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    rest = [p.name for p in forward_parameters(comp.obj)[1:] if p.default is p.empty and p.name not in GIVEN]
    cannot_fill(comp.name, rest, (), [comp.name], "n_heads", (
        "the slopes' function takes the number of heads alone, its other settings with defaults",
        "斜率函数只接收头数，其他设置要有默认值"))
    errors = {n: fp.max_error(_slopes(ctx, comp, n), V.alibi_slopes(n)) for n in HEADS}
    res.max_abs_error = max(errors.values())
    res.checks.append(Check(text("each head's slope 2^(-8h/n), h = 1..n, for 4, 8 and 16 heads",
                                 "4、8、16 个头时，每个头的斜率都是 2^(-8h/n)，h = 1..n"),
                            res.max_abs_error < 1e-6, error_text(res.max_abs_error)))
    if res.max_abs_error >= 1e-6:
        n = max(errors, key=errors.get)
        note_departure(res, lambda: localize_slopes(comp.obj, n))
    return finish(res)


def _slopes(ctx: Context, comp: Component, n: int) -> Tensor:
    """The learner's slopes for n heads, flattened to (H,) (MPT's are (1, H, 1, 1))."""
    given = {p.name: GIVEN[p.name] for p in forward_parameters(comp.obj)[1:] if p.name in GIVEN}
    return torch.as_tensor(ctx.learner.call("forward", comp.obj, n, **given)).double().flatten()


def slope_views(n: int) -> list[View]:
    """The slopes' sub-steps for n heads: the heads 1..n, their exponents 8h/n, the powers 2^(8h/n),
    the slopes and MPT's (1, H, 1, 1) of them."""
    heads = torch.arange(1, n + 1, dtype=torch.float64)  # (H,)
    exponents = heads * 8 / n
    slopes = V.alibi_slopes(n)
    return [("the heads 1 .. n", heads), ("the exponents 8h/n", exponents), ("2^(8h/n)", 2 ** exponents),
            ("the exponents -8h/n", -exponents), ("the slopes 2^(-8h/n)", slopes),
            ("the slopes (1, H, 1, 1)", slopes.view(1, n, 1, 1))]


def localize_slopes(fn: object, n: int) -> Departure | None:
    """Run the learner's slopes function for n heads traced, each tensor it makes a step: the first step
    that is none of the slopes' sub-steps."""
    filename = inspect.getsourcefile(fn)
    steps = trace_steps(lambda: fn(n), filename, every=True)
    return first_departure(steps, slope_views(n), filename, {"n_heads": n})
