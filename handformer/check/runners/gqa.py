"""Runner for grouped-query attention: an attention built with fewer key/value heads than query
heads (`n_kv_heads`, `num_kv_heads`), checked as multi-head attention is, against handformer's
MultiHeadAttention(d_model, n_heads, n_kv_heads); and a `repeat_kv(x, n_rep)` function, against
handformer's.

Shape legend: B batch, S length, Hkv key/value heads, H query heads, Dh head dim.
"""

from __future__ import annotations

import inspect

from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, finish, forward_parameters, names_of
from handformer.check.core.discovery import Component, causal_inside
from handformer.check.core.result import Check, ComponentResult, text
from handformer.check.reference import variants as V
from handformer.check.runners.attention import check_mha
from handformer.nn.attention import repeat_kv

KV_HEADS, N_REP = 2, 3  # a function is checked on 2 key/value heads shared by 3 query heads each


def check_gqa(comp: Component, ctx: Context) -> ComponentResult:
    if inspect.isclass(comp.obj):
        return check_mha(comp, ctx, causal_inside=causal_inside(comp.obj), n_kv_heads=KV_HEADS)
    return check_repeat_kv(comp, ctx)


def check_repeat_kv(comp: Component, ctx: Context) -> ComponentResult:
    """repeat_kv(x, n_rep): (B, Hkv, S, Dh) -> (B, Hkv * n_rep, S, Dh), each key/value head repeated
    for n_rep consecutive query heads; Meta's layout (B, S, Hkv, Dh) is a convention."""
    res = ctx.result(comp)
    x = fp.randn(2, KV_HEADS, 5, 4, seed=1)  # (B, Hkv, S, Dh)
    out, given, dim = _repeated(ctx, comp, x)
    as_heads_second = out if dim == 1 else out.transpose(1, 2)  # (B, H, S, Dh)
    if dim == 2:
        res.notes.append(text("layout (B, S, Hkv, Dh), heads third (Meta's)",
                              "排布为 (B, S, Hkv, Dh)，头在第三维（Meta 的写法）"))
    found = fp.search(as_heads_second, lambda fl: V.repeat_kv(x, N_REP, fl), ("kv_repeat_order",), None, 1)
    if found and found[0]:
        off = fp.max_error(as_heads_second, repeat_kv(x, N_REP))
        res.findings += ctx.findings(found[0], found[1], off, comp)
    err = fp.max_error(as_heads_second, repeat_kv(x, N_REP))
    one = _call(ctx, comp, given, 1, dim)
    err_one = fp.max_error(one, given)
    res.max_abs_error = max(err, err_one)
    res.checks.append(Check(text(f"equals handformer's repeat_kv for {KV_HEADS} key/value heads, "
                                 f"n_rep = {N_REP}",
                                 f"Hkv = {KV_HEADS}、n_rep = {N_REP} 时与 handformer 的 repeat_kv 一致"),
                            err < 1e-12, error_text(err)))
    res.checks.append(Check(text("n_rep = 1 returns the input", "n_rep = 1 时原样返回输入"), err_one < 1e-12,
                            error_text(err_one)))
    return finish(res)


COUNT_NAMES = ("n_rep", "repeats", "n_repeats", "num_repeats", "rep", "n", "num_rep", "n_groups", "groups")
AXIS_NAMES = ("dim", "axis")


def _call(ctx: Context, comp: Component, given: Tensor, n_rep: int, axis: int = 1) -> Tensor | None:
    """The learner's repeat_kv on `given` repeated n_rep times: the same tensor for each tensor it takes
    before the count (Mistral's repeat_kv(keys, values, repeats, dim), its heads' axis handed as `dim`);
    the first tensor it returns."""
    required = names_of(forward_parameters(comp.obj))[1]
    tensors = max(1, [*(i for i, name in enumerate(required) if name in COUNT_NAMES), len(required) - 1][0])
    axes = dict.fromkeys(set(required[tensors + 1:]) & set(AXIS_NAMES), axis)
    return fp.first_tensor(ctx.learner.call("forward", comp.obj, *[given] * tensors, n_rep, **axes), 4)


def _repeated(ctx: Context, comp: Component, x: Tensor) -> tuple[Tensor, Tensor, int]:
    """The learner's repeat_kv(x, N_REP) with the heads second, else third (Meta's (B, S, Hkv, Dh));
    (its output, the input given, the heads' axis)."""
    B, _, S, Dh = x.shape
    layouts = ((x, 1), (x.transpose(1, 2).contiguous(), 2))  # heads second, or third (Meta)
    for i, (given, dim) in enumerate(layouts):
        try:
            out = _call(ctx, comp, given, N_REP, dim)
        except fp.LearnerFailure:
            if i == len(layouts) - 1:
                raise
            continue
        expect = given.shape[:dim] + (KV_HEADS * N_REP,) + given.shape[dim + 1:]
        if out is not None and tuple(out.shape) == tuple(expect):
            return out, given, dim
    raise ctx.learner.fail("forward", f"{comp.name}(x, {N_REP}) with x of shape {tuple(x.shape)} "
                           f"returned no tensor of shape {(B, KV_HEADS * N_REP, S, Dh)}",
                           f"x 的形状为 {tuple(x.shape)} 时，{comp.name}(x, {N_REP}) 没有返回形状为 "
                           f"{(B, KV_HEADS * N_REP, S, Dh)} 的张量")
