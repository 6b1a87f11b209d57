"""Runners for the layers: encoder layer, decoder layer, decoder-only block.

The learner's parameters are mapped by shape and definition order: the (d_model, d_model) linears
are the attentions' W_Q, W_K, W_V, W_O in order, the (d_ff, d_model) and (d_model, d_ff) ones the
FFN, the norms one per sublayer in order. The fingerprint search then runs over the norm placement
(post, the paper's, or pre), the attention mistakes, and the layer mistakes (residual missing,
one sublayer's norm misplaced, FFN activation missing, the decoder's masks swapped).

Shape legend: B batch, T target length, S source length, D d_model, H heads, F FFN width.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check import fingerprint as fp
from handformer.check import variants as V
from handformer.check.context import (
    ATTENTION_FLAGS,
    F_WIDTH,
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
from handformer.check.pieces import FFN_ACTIVATIONS, HF_NAME
from handformer.check.result import DIFFERS, Check, ComponentResult, Finding, text
from handformer.check.source import locate, source_lines
from handformer.check.weights import (
    Slot,
    attention_slots,
    copy_attention,
    copy_ffn,
    copy_weights,
    ffn_slots,
    ffn_weights,
    leaves,
    mha_weights,
    norm_slots,
    norm_weights,
)
from handformer.config import BlockConfig
from handformer.nn.blocks import DecoderLayer, EncoderLayer


class Layer:
    """The learner's layer, its mapping, and a uniform call (x, memory, src_keep, tgt_keep)."""

    def __init__(self, comp: Component, ctx: Context, decoder: bool, causal_block: bool) -> None:
        self.comp, self.ctx, self.decoder, self.causal_block = comp, ctx, decoder, causal_block
        self.module = ctx.build(comp)
        found = leaves(self.module)
        linears = [leaf for leaf in found if leaf.kind == "linear"]
        self.attn = attention_slots(linears, D, 2 if decoder else 1, comp.name)
        self.ffn_candidates = ffn_slots(linears, D, F_WIDTH, comp.name)
        names = ["attn", "cross", "ffn"] if decoder else ["attn", "ffn"]
        self.norm_slots = norm_slots([leaf for leaf in found if leaf.kind == "norm"], len(names),
                                     ["self-attention" if n == "attn" else "cross-attention" if n == "cross"
                                      else "FFN" for n in names], comp.name)
        self.sublayers = names
        params = forward_parameters(self.module)
        self.inputs = [p.name for p in params if not is_mask_name(p.name)]
        self.masks = [p.name for p in params if is_mask_name(p.name)]
        self.takes_mask = bool(self.masks)

    def call(self, x: Tensor, memory: Tensor | None, src: Tensor | None, tgt: Tensor | None) -> Any:
        args: list[Any] = [x] + ([memory] if self.decoder else [])
        kwargs = {}
        if self.decoder:
            src_name, tgt_name = _decoder_mask_names(self.masks)
            if src_name and tgt_name:
                kwargs = {src_name: src, tgt_name: tgt}
            else:
                args += [src, tgt]
        elif self.masks:
            kwargs = {self.masks[0]: tgt if self.causal_block else src}
        return self.module(*args, **kwargs)

    def weights(self, slots: list[Slot], act: str, placement: str) -> V.LayerWeights:
        return V.LayerWeights(mha_weights(self.attn[0], H), ffn_weights(slots, act),
                              [norm_weights(s) for s in self.norm_slots],
                              mha_weights(self.attn[1], H) if self.decoder else None, placement,
                              self.sublayers)


def _decoder_mask_names(masks: list[str]) -> tuple[str | None, str | None]:
    src = next((m for m in masks if any(t in m.lower() for t in ("src", "memory", "enc", "cross", "pad"))),
               None)
    tgt = next((m for m in masks if m != src and any(
        t in m.lower() for t in ("tgt", "trg", "self", "look", "causal", "dec", "target", "sub"))), None)
    return src, tgt


def _flags(layer: Layer, w: V.LayerWeights) -> tuple[str, ...]:
    flags = ATTENTION_FLAGS + tuple(f for f in HEAD_FLAGS if f != "no_output_projection" or w.self_attn.o)
    flags += tuple(f"no_residual:{s}" for s in layer.sublayers)
    flags += tuple(f"pre_norm:{s}" for s in layer.sublayers) + ("ffn_no_activation",)
    if layer.decoder:
        flags += ("decoder_masks_swapped",)
    if layer.causal_block and not layer.takes_mask:
        flags += ("causal_off_by_one:no_self", "causal_off_by_one:sees_next")
    return flags


def check_encoder_layer(comp: Component, ctx: Context) -> ComponentResult:
    return _check_layer(comp, ctx, decoder=False, causal_block=False, expected="post")


def check_decoder_layer(comp: Component, ctx: Context) -> ComponentResult:
    return _check_layer(comp, ctx, decoder=True, causal_block=False, expected="post")


def check_block(comp: Component, ctx: Context) -> ComponentResult:
    return _check_layer(comp, ctx, decoder=False, causal_block=True, expected="pre")


def _check_layer(comp: Component, ctx: Context, decoder: bool, causal_block: bool,
                 expected: str) -> ComponentResult:
    res = ComponentResult(comp.kind, comp.name)
    layer = Layer(comp, ctx, decoder, causal_block)
    B, T, S = 2, 6, 6  # T == S: a layer that swaps its masks still runs, so the swap can be named
    x, memory = fp.randn(B, T, D, seed=1), fp.randn(B, S, D, seed=2)
    src_keep = positions(B, S, [0, 2])
    tgt_keep = causal(T) & positions(B, T, [1, 0])
    if causal_block:
        src_keep, tgt_keep = None, causal(T)[None, None]

    def search_rows(flags: frozenset[str]) -> Tensor | None:
        """The rows the masks leave visible as the layer with these mistakes applies them (inverted, or
        off by one in a block that builds its own)."""
        if causal_block and not layer.takes_mask:
            return fp.visible_rows(V.applied_keep(V.causal_keep(T, flags)[None, None], flags), B, T)
        return _rows(layer, V.applied_keep(src_keep, flags), V.applied_keep(tgt_keep, flags), B, T)

    def run(conv: str) -> Tensor | None:
        src = fp.encode_mask(src_keep, conv)
        tgt = fp.encode_mask(tgt_keep, conv) if layer.takes_mask or not causal_block else None
        return fp.first_tensor(ctx.learner.call("forward", layer.call, x, memory, src, tgt), 3)

    working = first_working(ctx, run)
    check_determinism(res, ctx, comp, lambda: run(working), "mha", "ffn", "sdpa")
    with fp.dropout_off():
        found = _search(layer, ctx, run, x, memory, src_keep, tgt_keep, search_rows, expected)
        if found is None:
            res.notes.append(text("no known mistake (or pair of them) reproduces your output; see the "
                                  "checks below for where it goes wrong",
                                  "没有任何已知错误（或两个错误的组合）能复现你的输出；请看下面的检查项定位问题"))
            conv, slots, act, placement = found_default(layer, ctx)
        else:
            conv, slots, act, placement, flags, matched = found
            correct_w = layer.weights(slots, act, expected)
            correct = _compute(layer, correct_w, x, memory, src_keep, tgt_keep, frozenset())
            out = run(conv)
            if flags:
                res.findings += ctx.findings(flags, matched, fp.max_error(out, correct, search_rows(flags)),
                                             comp, "mha", "ffn", "sdpa", "causal_mask")
            nan_on_hidden_rows(res, out, search_rows(flags), comp, ctx)
        res.mapping = [s.describe() for group in layer.attn for s in group] + [
            s.describe() for s in slots] + [s.describe() for s in layer.norm_slots]
        if layer.takes_mask or decoder:
            res.convention = fp.describe_convention(conv)
        unbiased = [s for s in layer.norm_slots if norm_weights(s).kind == "layernorm_unbiased_std"]
        if unbiased:
            number, code = locate("layernorm_unbiased_std", source_lines(ctx.objects(comp, "layernorm")))
            res.findings.append(Finding("layernorm_unbiased_std", text(
                f"{', '.join(s.leaf.name for s in unbiased)} compute w * (x - mean) / (x.std() + eps) + b",
                f"{', '.join(s.leaf.name for s in unbiased)} 计算的是 w * (x - mean) / (x.std() + eps) + b"),
                number, code))
        if placement != expected and found is not None:
            res.notes.append(_placement_note(placement, expected))
            if not res.findings:
                res.status = DIFFERS
        guarded(res, lambda: _compare(res, layer, ctx, conv, slots, act, placement))
        guarded(res, lambda: _properties(res, layer, ctx, conv))
    guarded(res, lambda: _tutorial_shapes(res, layer, ctx))
    return finish(res)


def _placement_note(placement: str, expected: str) -> dict[str, str]:
    if placement == "pre":
        return text("every sublayer is pre-norm, x = x + f(norm(x)), where the paper's layer is post-norm, "
                    "x = norm(x + f(x)): a difference by design, not an error; compared with handformer's "
                    "pre-norm layer", "每个子层都是 pre-norm，x = x + f(norm(x))，而论文的层是 post-norm，"
                    "x = norm(x + f(x))：这是设计上的差异，不是错误；已与 handformer 的 pre-norm 层比较")
    return text("every sublayer is post-norm, x = norm(x + f(x)), where modern decoder-only blocks are "
                "pre-norm: a difference by design, not an error; compared with handformer's post-norm block",
                "每个子层都是 post-norm，x = norm(x + f(x))，而现代 decoder-only 块是 pre-norm：这是设计上的"
                "差异，不是错误；已与 handformer 的 post-norm 块比较")


def _rows(layer: Layer, src_keep: Tensor | None, tgt_keep: Tensor | None, B: int, T: int) -> Tensor | None:
    rows = None
    for keep in (tgt_keep, src_keep if layer.decoder or not layer.causal_block else None):
        r = fp.visible_rows(keep, B, T) if keep is not None else None
        if r is not None:
            rows = r if rows is None else rows & r
    return rows


def _compute(layer: Layer, w: V.LayerWeights, x: Tensor, memory: Tensor, src_keep: Tensor | None,
             tgt_keep: Tensor | None, flags: frozenset[str]) -> Tensor:
    if layer.decoder:
        return V.decoder_layer(w, x, memory, src_keep, tgt_keep, flags)
    if layer.causal_block:
        keep = tgt_keep if layer.takes_mask else V.causal_keep(x.size(1), flags)[None, None]
        return V.encoder_layer(w, x, keep, flags)
    return V.encoder_layer(w, x, src_keep, flags)


def found_default(layer: Layer, ctx: Context) -> tuple[str, list[Slot], str, str]:
    gated = len(layer.ffn_candidates[0]) == 3
    return ctx.conventions()[0], layer.ffn_candidates[0], FFN_ACTIVATIONS[gated][0], "post"


def _search(layer: Layer, ctx: Context, run: Callable[[str], Tensor | None], x: Tensor, memory: Tensor,
            src_keep: Tensor | None, tgt_keep: Tensor | None, rows: fp.Rows, expected: str,
            ) -> tuple[str, list[Slot], str, str, frozenset[str], float] | None:
    """Convention, FFN mapping, activation and placement first with at most one mistake, then with
    pairs: the smallest explanation of the learner's output."""
    gated = len(layer.ffn_candidates[0]) == 3
    # a block that builds its own mask is passed none: one convention is enough
    own_mask = layer.causal_block and not layer.takes_mask
    ran, failure = outputs_by_convention(run, ctx.conventions()[:1] if own_mask else ctx.conventions())
    outputs: dict[str, Tensor] = {}
    for conv, out in ran.items():
        if out.shape == x.shape and not any(torch.equal(out, seen) for seen in outputs.values()):
            outputs[conv] = out  # conventions that give the same output are searched once
    if not outputs:
        if failure:
            raise failure
        out = run(ctx.conventions()[0])
        raise layer.ctx.learner.fail("forward", f"{layer.comp.name} returned {shape_of(out)} for x of "
                                     f"shape {tuple(x.shape)}; a layer keeps the shape (B, T, d_model)")
    placements = (expected, "pre" if expected == "post" else "post")
    settings = list(itertools.product(outputs, layer.ffn_candidates, FFN_ACTIVATIONS[gated], placements))
    for min_flags, max_flags in ((0, 1), (2, 2)):  # pairs only once no smaller set matched
        best = None
        for conv, slots, act, placement in settings:
            w = layer.weights(slots, act, placement)
            universe = _flags(layer, w)
            def compute(flags: frozenset[str], w=w) -> Tensor:
                return _compute(layer, w, x, memory, src_keep, tgt_keep, flags)

            found = fp.search(outputs[conv], compute, universe, rows, max_flags, min_flags)
            if found is not None and (best is None or len(found[0]) < len(best[4])):
                best = (conv, slots, act, placement, found[0], found[1])
                if not found[0]:
                    return best
        if best:
            return best
    return None


def _hf_layer(layer: Layer, slots: list[Slot], act: str, placement: str) -> nn.Module:
    gated = len(slots) == 3
    first = norm_weights(layer.norm_slots[0])
    cfg = BlockConfig(d_model=D, n_heads=H, d_ff=F_WIDTH, dropout=0.0, activation=HF_NAME[(gated, act)],
                      norm="rmsnorm" if first.kind == "rmsnorm" else "layernorm", norm_placement=placement,
                      norm_eps=first.eps)
    hf = (DecoderLayer(cfg) if layer.decoder else EncoderLayer(cfg)).double().eval()
    for target, group in zip([hf.self_attn] + ([hf.cross_attn] if layer.decoder else []), layer.attn):
        copy_attention(target, group)
    copy_ffn(hf.ffn, slots)
    norms = [hf.attn_norm] + ([hf.cross_attn_norm] if layer.decoder else []) + [hf.ffn_norm]
    for target, slot in zip(norms, layer.norm_slots):
        copy_weights(target, slot)
    return hf


def _compare(res: ComponentResult, layer: Layer, ctx: Context, conv: str, slots: list[Slot], act: str,
             placement: str) -> None:
    """Against handformer's EncoderLayer / DecoderLayer / DecoderOnlyBlock on several shapes."""
    hf = _hf_layer(layer, slots, act, placement)
    cases = [(2, 5, 7, [0, 0], [0, 0]), (3, 4, 9, [0, 3, 9], [0, 1, 0]), (1, 1, 3, [0], [0])]
    errors, grad_err = [], 0.0
    for i, (B, T, S, src_pad, tgt_pad) in enumerate(cases):
        if not layer.decoder:
            S = T
        x = fp.randn(B, T, D, seed=10 + i).requires_grad_()
        memory = fp.randn(B, S, D, seed=20 + i)
        src_keep = positions(B, S, [min(p, S) for p in src_pad])
        tgt_keep = causal(T) & positions(B, T, [min(p, T - 1) for p in tgt_pad])
        if layer.causal_block:
            src_keep, tgt_keep = None, causal(T)[None, None]
        with torch.enable_grad():
            tgt_mask = fp.encode_mask(tgt_keep, conv) if layer.takes_mask or not layer.causal_block else None
            raw = ctx.learner.call("forward", layer.call, x, memory, fp.encode_mask(src_keep, conv), tgt_mask)
            out = fp.first_tensor(raw, 3)
            if layer.decoder:
                ref = hf(x, memory, src_keep, tgt_keep)[0]  # the tutorial's order: src_mask, tgt_mask
            else:
                ref = hf(x, tgt_keep if layer.causal_block else src_keep)[0]
            rows = _rows(layer, src_keep, tgt_keep, B, T)
            errors.append(fp.max_error(out, ref, rows))
            masked_rows(res, out, rows, layer.comp, ctx)
            if i == 0 and out is not None and out.shape == ref.shape:
                g = fp.randn(*ref.shape, seed=5)
                mine = torch.autograd.grad((out * g).sum(), [x, layer.norm_slots[0].leaf.weight])
                theirs = torch.autograd.grad((ref * g).sum(), [x, hf.attn_norm.weight])
                grad_err = grads_error(list(zip(mine, theirs)))
    res.max_abs_error = max(errors)
    name = "DecoderLayer" if layer.decoder else "DecoderOnlyBlock" if layer.causal_block else "EncoderLayer"
    res.checks.append(Check(text(f"matches handformer's {name} ({placement}-norm) on {len(cases)} shapes",
                                 f"在 {len(cases)} 种形状上与 handformer 的 {name}（{placement}-norm）一致"),
                            res.max_abs_error < 1e-5, error_text(res.max_abs_error)))
    res.checks.append(Check(text("gradients (input and first norm) match handformer's",
                                 "梯度（输入与第一个归一化层）与 handformer 一致"), grad_err < 1e-5,
                            error_text(grad_err)))


def _properties(res: ComponentResult, layer: Layer, ctx: Context, conv: str) -> None:
    """Causality of the (decoder) self-attention and padding invariance of the keys."""
    B, T, j = 2, 7, 3
    x, memory = fp.randn(B, T, D, seed=40), fp.randn(B, T, D, seed=41)
    if layer.decoder or layer.causal_block:
        tgt = fp.encode_mask(causal(T)[None, None], conv) if layer.takes_mask else None
        src = fp.encode_mask(positions(B, T, [0, 0]), conv)
        bumped = x.clone()
        bumped[:, j] += 1.0
        a = fp.first_tensor(ctx.learner.call("forward", layer.call, x, memory, src, tgt), 3)
        b = fp.first_tensor(ctx.learner.call("forward", layer.call, bumped, memory, src, tgt), 3)
        past = (a - b).abs().amax(-1)[:, :j].max().item()
        res.checks.append(Check(text(f"causality: changing token {j} leaves outputs 0..{j - 1} unchanged",
                                     f"因果性：改变第 {j} 个 token 不影响输出 0..{j - 1}"), past < 1e-9,
                                text(f"outputs before it moved by {past:.3g}",
                                     f"之前位置的输出变化了 {past:.3g}")))
    if layer.takes_mask and not layer.causal_block:
        keep = positions(B, T, [0, 3])
        other = (memory if layer.decoder else x).clone()
        other[1, T - 3:] += 5.0
        tgt = fp.encode_mask(causal(T)[None, None], conv)
        src = fp.encode_mask(keep, conv)

        def run(x: Tensor, memory: Tensor | None) -> Tensor | None:
            return fp.first_tensor(ctx.learner.call("forward", layer.call, x, memory, src, tgt), 3)

        if layer.decoder:
            moved = (run(x, memory) - run(x, other)).abs().max().item()
        else:
            moved = (run(x, None) - run(other, None))[:, : T - 3].abs().max().item()
        res.checks.append(Check(text("padding invariance: changing padded positions changes no real one",
                                     "填充不变性：改变被填充的位置不影响真实位置的输出"), moved < 1e-9,
                                text(f"outputs moved by {moved:.3g}", f"输出变化了 {moved:.3g}")))


def _tutorial_shapes(res: ComponentResult, layer: Layer, ctx: Context) -> None:
    """The tutorial's example: encoder (2, 10, 512) -> (2, 10, 512); decoder (2, 5, 512) with
    enc_output (2, 10, 512) -> (2, 5, 512), cross-attention weights (2, 8, 5, 10)."""
    module = ctx.build(layer.comp, TUTORIAL, checked=False)
    big = Layer.__new__(Layer)
    big.__dict__.update(layer.__dict__)
    big.module = module
    T = 5 if layer.decoder else 10
    x, memory = torch.randn(2, T, 512), torch.randn(2, 10, 512)
    tgt = causal(T)[None, None].long() if layer.takes_mask or not layer.causal_block else None
    raw = ctx.learner.call("forward", big.call, x, memory, None, None if not layer.causal_block else tgt)
    out, weights = fp.first_tensor(raw, 3), fp.weights_of(raw, skip_first=True)
    want = (2, T, 512)
    ok = out is not None and tuple(out.shape) == want and (
        weights is None or tuple(weights.shape) == ((2, 8, 5, 10) if layer.decoder else (2, 8, T, T)))
    expect = "(2, 5, 512), cross-attention (2, 8, 5, 10)" if layer.decoder else str(want)
    res.checks.append(Check(text(f"shapes as the tutorial states: {expect}", f"形状与教程一致：{expect}"), ok,
                            text(f"got {shape_of(raw)}", f"实际得到 {shape_of(raw)}")))
