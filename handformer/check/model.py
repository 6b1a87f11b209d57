"""Runner for the full encoder-decoder model (`Transformer(src_vocab_size, tgt_vocab_size, ...)`).

Its layers are checked one by one against handformer by the layer runners; the model as a whole is
checked without a reference (tutorials differ in embedding scale, output bias and weight tying, so
there is no single right set of logits): the logits' shape, eval determinism, no NaN, causality
of the decoder (changing target token j leaves the logits before j unchanged), padding invariance
of the source (more padding changes nothing), and batch invariance (a sentence alone gives the
same logits as in a batch).

Shape legend: B batch, S source length, T target length, V target vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from handformer.check import fingerprint as fp
from handformer.check.context import SIZES, Context, causal, check_determinism, finish, forward_parameters
from handformer.check.discovery import Component
from handformer.check.result import Check, ComponentResult, text

SRC_V, TGT_V, PAD = 23, 29, 0
MODEL_SIZES = {**SIZES, "src_vocab": SRC_V, "tgt_vocab": TGT_V, "n_layers": 2, "pad_id": PAD}


def _caller(module: torch.nn.Module) -> Any:
    """(src, tgt) -> logits; masks (0/1 int, pad 0, causal target) are passed when forward asks."""
    params = forward_parameters(module)
    masks = [p.name for p in params if "mask" in p.name.lower()]

    def call(src: Tensor, tgt: Tensor) -> Any:
        kwargs = {}
        for name in masks:
            if any(t in name.lower() for t in ("src", "enc", "memory", "source")):
                kwargs[name] = (src != PAD)[:, None, None, :].long()  # (B, 1, 1, S)
            else:
                T = tgt.size(1)
                keep = causal(T)[None, None] & (tgt != PAD)[:, None, None, :]  # (B, 1, T, T)
                kwargs[name] = keep.long()
        return module(src, tgt, **kwargs)

    return call


def check_model(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    module = ctx.build(comp, MODEL_SIZES)
    call = _caller(module)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(1, SRC_V, (2, 7), generator=g)
    src[1, 5:] = PAD
    tgt = torch.randint(1, TGT_V, (2, 5), generator=g)

    def run(src: Tensor = src, tgt: Tensor = tgt) -> Tensor | None:
        return fp.first_tensor(ctx.learner.call("forward", call, src, tgt), 3)

    check_determinism(res, ctx, comp, run, "encoder_layer", "decoder_layer", "mha", "ffn")
    with fp.dropout_off():
        out = run()
        ok = out is not None and tuple(out.shape) == (2, 5, TGT_V)
        got = tuple(out.shape) if out is not None else None
        res.checks.append(Check(text(f"logits of shape (B, T, tgt_vocab) = (2, 5, {TGT_V})",
                                     f"logits 的形状为 (B, T, tgt_vocab) = (2, 5, {TGT_V})"), ok,
                                text(f"got {got}", f"实际得到 {got}")))
        if not ok:
            return finish(res)
        res.checks.append(Check(text("no NaN or inf", "没有 NaN 或 inf"), bool(torch.isfinite(out).all())))
        bumped = tgt.clone()
        bumped[:, 3] = (bumped[:, 3] % (TGT_V - 1)) + 1
        moved = (run(tgt=bumped) - out).abs()[:, :3].max().item()
        res.checks.append(Check(text("causality: changing target token 3 leaves logits 0..2 unchanged",
                                     "因果性：改变目标端第 3 个 token 不影响位置 0..2 的 logits"),
                                moved < 1e-9, text(f"moved by {moved:.3g}", f"变化了 {moved:.3g}")))
        longer = torch.cat([src, torch.full((2, 2), PAD)], dim=1)
        moved = (run(src=longer) - out).abs().max().item()
        res.checks.append(Check(text("padding invariance: more source padding changes nothing",
                                     "填充不变性：源端多加填充不影响结果"), moved < 1e-9,
                                text(f"moved by {moved:.3g}", f"变化了 {moved:.3g}")))
        alone = (run(src=src[:1], tgt=tgt[:1]) - out[:1]).abs().max().item()
        res.checks.append(Check(text("batch invariance: a sentence alone gives its logits in a batch",
                                     "批次不变性：单独一句与放在批次中的 logits 相同"), alone < 1e-9,
                                text(f"moved by {alone:.3g}", f"变化了 {alone:.3g}")))
    res.notes.append(text("the model as a whole has no reference (tutorials differ in embedding scale, "
                          "output bias, weight tying); its layers are compared with handformer's one by one",
                          "整个模型没有统一的参考（各教程在嵌入缩放、输出偏置、权重共享上不同）；"
                          "它的各层已逐一与 handformer 比较"))
    return finish(res)
