"""Runners for attention: the scaled dot-product function, multi-head attention (self and cross),
and causal self-attention that builds its own mask.

Each compares the learner's output (and returned weights, and gradients) with handformer's own
component on several shapes and masks, runs the reference-free checks (causality, padding
invariance, heads one by one, no NaN on fully masked rows, eval determinism, the tutorials' shapes),
and names mistakes by fingerprint search over `handformer.check.variants`.

Shape legend: B batch, T query length, S key length, D d_model, H heads, Dh head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check import fingerprint as fp
from handformer.check import variants as V
from handformer.check.context import (
    ATTENTION_FLAGS,
    HEAD_FLAGS,
    TUTORIAL,
    Context,
    D,
    H,
    causal,
    check_determinism,
    error_text,
    finish,
    first_working,
    forward_parameters,
    grads_error,
    guarded,
    is_mask_name,
    masked_rows,
    nan_on_hidden_rows,
    outputs_by_convention,
    positions,
    shape_of,
)
from handformer.check.discovery import Component
from handformer.check.result import Check, ComponentResult, Finding, text
from handformer.check.source import locate, source_lines
from handformer.check.weights import (
    Slot,
    attention_parameters,
    attention_slots,
    copy_attention,
    leaves,
    mha_weights,
)
from handformer.nn.attention import MultiHeadAttention, scaled_dot_product_attention

Call = Callable[[Tensor, Tensor, Tensor, Tensor | None], Any]


def caller(fn: Any) -> tuple[Call, int, bool]:
    """A uniform (xq, xk, xv, mask) call into the learner's forward or function; also how many
    inputs it takes (1: self-attention only) and whether it takes a mask."""
    params = forward_parameters(fn)
    inputs = [p for p in params if not is_mask_name(p.name)]
    masks = [p for p in params if is_mask_name(p.name)]
    n = 3 if len(inputs) >= 3 else len(inputs)

    def call(xq: Tensor, xk: Tensor, xv: Tensor, mask: Tensor | None) -> Any:
        args = [xq, xk, xv][:n]
        kwargs = {masks[0].name: mask} if masks and mask is not None else {}
        return fn(*args, **kwargs)

    return call, n, bool(masks)


def detect(ctx: Context, run: Callable[[str], Tensor | None], compute: Callable[[frozenset[str]], Tensor],
           universe: tuple[str, ...], rows: fp.Rows,
           ) -> tuple[str | None, tuple[frozenset[str], float] | None, fp.LearnerFailure | None]:
    """The mask convention that explains the learner's output with the fewest mistakes, and those
    mistakes. Returns (convention, (flags, error) or None, the first learner failure)."""
    outputs, failure = outputs_by_convention(run, ctx.conventions())
    for min_flags, max_flags in ((0, 1), (2, 2)):  # pairs only once no smaller set matched
        best = None
        for conv, out in outputs.items():
            found = fp.search(out, compute, universe, rows, max_flags, min_flags)
            if found is not None and (best is None or len(found[0]) < len(best[1][0])):
                best = (conv, found)
            if found is not None and not found[0]:
                break
        if best:
            return best[0], best[1], failure
    return (next(iter(outputs), None), None, failure)


def check_sdpa(comp: Component, ctx: Context) -> ComponentResult:
    res = ComponentResult(comp.kind, comp.name)
    fn = comp.obj
    if isinstance(fn, type):
        fn = ctx.learner.call("__init__", lambda: comp.obj(**_dropout_kwargs(comp.obj)))
        if isinstance(fn, nn.Module):
            fn = fn.double().eval()
    call, _, takes_mask = caller(fn)
    B, T, S, Dh = 2, 6, 6, 8
    q, k, v = fp.randn(B, H, T, Dh, seed=1), fp.randn(B, H, S, Dh, seed=2), fp.randn(B, H, S, Dh, seed=3)
    keep = causal(T) & positions(B, S, [0, 2])  # (B, 1, T, S)

    def run(conv: str) -> Tensor | None:
        return fp.first_tensor(ctx.learner.call("forward", call, q, k, v, fp.encode_mask(keep, conv)), 4)

    working = first_working(ctx, run)
    check_determinism(res, ctx, comp, lambda: run(working))

    def search_rows(flags: frozenset[str]) -> Tensor | None:
        return fp.visible_rows(V.applied_keep(keep, flags), B, T)  # an inverted mask hides other rows

    with fp.dropout_off():
        conv, found, failure = detect(ctx, run, lambda fl: V.attention(q, k, v, keep, fl)[0],
                                      ATTENTION_FLAGS, search_rows)
        if conv is None:
            raise failure or ctx.learner.fail("forward", f"{comp.name} returned no (B, H, T, Dh) tensor")
        res.convention = fp.describe_convention(conv)
        correct = V.attention(q, k, v, keep)[0]
        if found and found[0]:
            res.findings += ctx.findings(found[0], found[1],
                                         fp.max_error(run(conv), correct, search_rows(found[0])), comp, "mha")
        if found:
            nan_on_hidden_rows(res, run(conv), search_rows(found[0]), comp, ctx)
        errors = []
        cases = [("no mask", 2, 5, 5, None), ("padding", 3, 4, 7, positions(3, 7, [0, 2, 7])),
                 ("causal + padding", 2, 6, 6, keep), ("cross, T != S", 2, 3, 5, positions(2, 5, [0, 1]))]
        for _label, b, t, s, mask in cases:
            mask = mask if takes_mask else None
            q, k, v = (fp.randn(b, H, t, Dh, seed=4), fp.randn(b, H, s, Dh, seed=5),
                       fp.randn(b, H, s, Dh, seed=6))
            raw = ctx.learner.call("forward", call, q, k, v, fp.encode_mask(mask, conv))
            ref, ref_w = scaled_dot_product_attention(q, k, v, mask, need_weights=True)
            rows = fp.visible_rows(mask, b, t)
            out = fp.first_tensor(raw, 4)
            errors.append(fp.max_error(out, ref, rows))
            weights = fp.weights_of(raw)
            if weights is not None:
                errors.append(fp.max_error(weights, ref_w, rows))
            masked_rows(res, out, rows, comp, ctx)
        res.max_abs_error = max(errors)
        res.checks.append(Check(text("matches handformer's scaled_dot_product_attention on 4 cases",
                                     "在 4 组输入上与 handformer 的 scaled_dot_product_attention 一致"),
                                res.max_abs_error < 1e-5, error_text(res.max_abs_error)))
    return finish(res)


def _dropout_kwargs(cls: type) -> dict[str, float]:
    params = forward_parameters(cls.__init__)
    return {p.name: 0.1 for p in params if "drop" in p.name.lower() and p.default is p.empty}


def _hf_attention(slots: list[Slot]) -> MultiHeadAttention:
    hf = MultiHeadAttention(D, H).double().eval()
    copy_attention(hf, slots)
    return hf


def check_mha(comp: Component, ctx: Context, causal_inside: bool = False) -> ComponentResult:
    res = ComponentResult(comp.kind, comp.name)
    module = ctx.build(comp)
    linears = [leaf for leaf in leaves(module) if leaf.kind == "linear"]
    slots = attention_slots(linears, D, 1, comp.name)[0]
    res.mapping = [s.describe() for s in slots]
    w = mha_weights(slots, H)
    call, n_inputs, takes_mask = caller(module)
    if not takes_mask and not causal_inside:
        res.notes.append(text("its forward takes no mask: the masked cases were skipped",
                              "它的 forward 不接收掩码：跳过了带掩码的用例"))
    universe = ATTENTION_FLAGS + tuple(f for f in HEAD_FLAGS if f != "no_output_projection" or w.o)
    if causal_inside:
        universe = tuple(f for f in universe if f.split(":")[0] not in ("mask_after_softmax",))
        universe += ("causal_off_by_one:no_self", "causal_off_by_one:sees_next")
    if w.o is None:
        number, code = locate("no_output_projection", source_lines([comp.obj]))
        res.findings.append(Finding("no_output_projection", text(
            f"{comp.name} has 3 nn.Linear(d_model, d_model) layers ({', '.join(res.mapping)}), no "
            "fourth one for W_O", f"{comp.name} 只有 3 个 nn.Linear(d_model, d_model)（"
            f"{', '.join(res.mapping)}），没有用于 W_O 的第四个"), number, code))
    B, T = 2, 6
    x = fp.randn(B, T, D, seed=1)
    keep = (causal(T) & positions(B, T, [0, 2])) if takes_mask else None
    if causal_inside:
        keep = causal(T)[None, None]

    def run(conv: str, x: Tensor = x) -> Tensor | None:
        mask = fp.encode_mask(keep, conv) if takes_mask else None
        return fp.first_tensor(ctx.learner.call("forward", call, x, x, x, mask), 3)

    def keep_for(flags: frozenset[str]) -> Tensor | None:
        return V.causal_keep(T, flags)[None, None] if causal_inside else keep  # an off-by-one is theirs

    def compute(flags: frozenset[str]) -> Tensor:
        return V.multi_head_attention(w, x, x, x, keep_for(flags), flags)[0]

    def search_rows(flags: frozenset[str]) -> Tensor | None:
        return fp.visible_rows(V.applied_keep(keep_for(flags), flags), B, T)

    working = first_working(ctx, run)
    check_determinism(res, ctx, comp, lambda: run(working), "sdpa")
    with fp.dropout_off():
        conv, found, failure = detect(ctx, run, compute, universe, search_rows)
        if conv is None:
            got = shape_of(ctx.learner.call("forward", call, x, x, x, fp.encode_mask(keep, working)))
            raise failure or ctx.learner.fail("forward", f"{comp.name} returned {got} for inputs of shape "
                                              f"{tuple(x.shape)}; expected a (B, T, D) tensor (and the "
                                              "weights (B, H, T, S) if you return them)")
        if takes_mask:
            res.convention = fp.describe_convention(conv)
        if found and found[0]:
            correct = fp.max_error(run(conv), compute(frozenset()), search_rows(found[0]))
            res.findings += ctx.findings(found[0], found[1], correct, comp, "sdpa")
        if found:
            nan_on_hidden_rows(res, run(conv), search_rows(found[0]), comp, ctx)
        guarded(res, lambda: _compare_mha(res, ctx, comp, module, slots, call, conv, n_inputs, takes_mask,
                                          causal_inside))
        guarded(res, lambda: _properties(res, ctx, comp, module, slots, call, conv, takes_mask,
                                         causal_inside))
    guarded(res, lambda: _tutorial_shapes(res, ctx, comp, n_inputs, takes_mask))
    return finish(res)


def _cases(n_inputs: int, takes_mask: bool, causal_inside: bool) -> list[tuple[str, int, int, int, Any]]:
    cases = [("self-attention, no mask", 2, 5, 5, None)]
    if takes_mask:
        cases += [("self-attention, padding (one row fully padded)", 3, 7, 7, positions(3, 7, [0, 2, 7])),
                  ("self-attention, causal + padding", 2, 6, 6, causal(6) & positions(2, 6, [0, 2]))]
        if n_inputs >= 2:
            cases.append(("cross-attention, T=4, S=9, padding", 2, 4, 9, positions(2, 9, [0, 3])))
    elif n_inputs >= 2 and not causal_inside:
        cases.append(("cross-attention, T=4, S=9", 2, 4, 9, None))
    if causal_inside:
        cases = [("causal self-attention", 2, 5, 5, "causal"), ("causal self-attention", 3, 8, 8, "causal")]
    return cases


def _compare_mha(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module,
                 slots: list[Slot], call: Call, conv: str, n_inputs: int, takes_mask: bool,
                 causal_inside: bool) -> None:
    hf = _hf_attention(slots)
    errors, grad_errors = [], []
    for i, (label, B, T, S, keep) in enumerate(_cases(n_inputs, takes_mask, causal_inside)):
        xq = fp.randn(B, T, D, seed=10 + i).requires_grad_()
        xkv = xq if S == T and "cross" not in label else fp.randn(B, S, D, seed=20 + i).requires_grad_()
        inside = isinstance(keep, str)
        mask = causal(T)[None, None] if inside else keep
        with torch.enable_grad():
            raw = ctx.learner.call("forward", call, xq, xkv, xkv,
                                   None if inside else fp.encode_mask(mask, conv))
            out = fp.first_tensor(raw, 3)
            if out is None:
                raise ctx.learner.fail("forward", f"{comp.name} returned {shape_of(raw)}, not a (B, T, D) "
                                       f"tensor, for inputs of shape {tuple(xq.shape)}")
            ref, ref_w = hf(xq, xkv, xkv, mask, need_weights=True)
            rows = fp.visible_rows(mask, B, T)
            errors.append(fp.max_error(out, ref, rows))
            weights = fp.weights_of(raw)
            if weights is not None:
                errors.append(fp.max_error(weights, ref_w, rows))
            masked_rows(res, out, rows, comp, ctx)
            if out.shape == ref.shape and i == len(_cases(n_inputs, takes_mask, causal_inside)) - 1:
                g = fp.randn(*out.shape, seed=99)
                sel = rows.reshape(B, T, 1) if rows is not None else 1.0
                mine = torch.autograd.grad((out * g * sel).sum(), [xq] + [s.leaf.weight for s in slots],
                                           allow_unused=True)
                hf_params = [attention_parameters(hf)[s.role].weight for s in slots]
                theirs = torch.autograd.grad((ref * g * sel).sum(), [xq] + hf_params, allow_unused=True)
                grad_errors.append(grads_error(list(zip(
                    [mine[0]] + [_rows(m, s) for m, s in zip(mine[1:], slots)], theirs))))
    res.max_abs_error = max(errors)
    res.checks.append(Check(text(f"matches handformer's MultiHeadAttention on {len(errors)} outputs",
                                 f"在 {len(errors)} 组输出上与 handformer 的 MultiHeadAttention 一致"),
                            res.max_abs_error < 1e-5, error_text(res.max_abs_error)))
    if grad_errors:
        res.checks.append(Check(text("gradients (input and weights) match handformer's",
                                     "梯度（输入与权重）与 handformer 一致"),
                                max(grad_errors) < 1e-5, error_text(max(grad_errors))))


def _rows(grad: Tensor | None, slot: Slot) -> Tensor | None:
    if grad is None or slot.rows is None:
        return grad
    return grad[slot.rows]


def _properties(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module,
                slots: list[Slot], call: Call, conv: str, takes_mask: bool, causal_inside: bool) -> None:
    """Reference-free checks: causality, padding invariance, heads one by one."""
    B, T, j = 2, 7, 3
    x = fp.randn(B, T, D, seed=30)
    bumped = x.clone()
    bumped[:, j] += 1.0
    if takes_mask or causal_inside:
        mask = None if causal_inside else fp.encode_mask(causal(T)[None, None], conv)
        a = fp.first_tensor(ctx.learner.call("forward", call, x, x, x, mask), 3)
        b = fp.first_tensor(ctx.learner.call("forward", call, bumped, bumped, bumped, mask), 3)
        moved = (a - b).abs().amax(-1).amax(0)  # (T,)
        past = moved[:j].max().item()
        res.checks.append(Check(text(f"causality: changing token {j} leaves outputs 0..{j - 1} unchanged",
                                     f"因果性：改变第 {j} 个 token 不影响输出 0..{j - 1}"),
                                past < 1e-9, text(f"outputs before it moved by {past:.3g}",
                                                  f"之前位置的输出变化了 {past:.3g}")))
    if takes_mask:
        keep = positions(B, T, [0, 3])
        xkv = fp.randn(B, T, D, seed=31)
        other = xkv.clone()
        other[1, T - 3:] += 5.0
        mask = fp.encode_mask(keep, conv)
        a = fp.first_tensor(ctx.learner.call("forward", call, x, xkv, xkv, mask), 3)
        b = fp.first_tensor(ctx.learner.call("forward", call, x, other, other, mask), 3)
        moved = (a - b).abs().max().item()
        res.checks.append(Check(text("padding invariance: changing padded keys/values changes nothing",
                                     "填充不变性：改变被填充的键/值不影响输出"), moved < 1e-9,
                                text(f"outputs moved by {moved:.3g}", f"输出变化了 {moved:.3g}")))
    w = mha_weights(slots, H)
    if w.o is not None and not causal_inside:
        out = fp.first_tensor(ctx.learner.call("forward", call, x, x, x, None), 3)
        heads = one_head_at_a_time(w, x)
        err = fp.max_error(out, heads)
        res.checks.append(Check(text("split + concat of heads equals the heads computed one by one",
                                     "拆分再拼接多头，与逐个头单独计算的结果一致"), err < 1e-5,
                                error_text(err)))


def one_head_at_a_time(w: V.MHAWeights, x: Tensor) -> Tensor:
    """softmax(Q_i K_i^T / sqrt(Dh)) V_i for each head i on its own slice of the weights, then
    concat and W_O: the paper's formula written without any reshape."""
    Dh = D // w.n_heads
    heads = []
    for i in range(w.n_heads):
        rows = slice(i * Dh, (i + 1) * Dh)
        q = x @ w.q[0][rows].T + (w.q[1][rows] if w.q[1] is not None else 0)  # (B, T, Dh)
        k = x @ w.k[0][rows].T + (w.k[1][rows] if w.k[1] is not None else 0)  # (B, T, Dh)
        v = x @ w.v[0][rows].T + (w.v[1][rows] if w.v[1] is not None else 0)  # (B, T, Dh)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(Dh), dim=-1)  # (B, T, T)
        heads.append(weights @ v)  # (B, T, Dh)
    return V.linear(torch.cat(heads, dim=-1), w.o)  # (B, T, D)


def _tutorial_shapes(res: ComponentResult, ctx: Context, comp: Component, n_inputs: int,
                     takes_mask: bool) -> None:
    """The tutorial's own example: (2, 10, 512) in, (2, 10, 512) out, weights (2, 8, 10, 10)."""
    module = ctx.build(comp, TUTORIAL, checked=False)
    call, _, _ = caller(module)
    x = torch.randn(2, 10, 512)
    with torch.no_grad():
        raw = ctx.learner.call("forward", call, x, x, x, None)
    out, weights = fp.first_tensor(raw, 3), fp.weights_of(raw)
    ok = out is not None and tuple(out.shape) == (2, 10, 512) and (
        weights is None or tuple(weights.shape) == (2, 8, 10, 10))
    got = shape_of(raw)
    res.checks.append(Check(text("shapes as the tutorial states: (2, 10, 512) -> (2, 10, 512), weights "
                                 "(2, 8, 10, 10)", "形状与教程一致：(2, 10, 512) -> (2, 10, 512)，注意力权重 "
                                 "(2, 8, 10, 10)"), ok, text(f"got {got}", f"实际得到 {got}")))


def check_causal_attention(comp: Component, ctx: Context) -> ComponentResult:
    return check_mha(comp, ctx, causal_inside=True)

