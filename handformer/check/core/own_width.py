"""A layer check built at a width its code does not take: the sizes check read from the names of its
constructor's arguments or its config's fields were not the ones its code uses (a config's `hidden`
read as the FFN's width where it is the model's). Its exception on check's input is then check's
guess, not the learner's mistake: where the layer, built the same way, runs on an input of the width
its own first layer takes and gives back that width (what a residual layer does), it is NOT CHECKED,
the width said."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch
from torch import nn

from handformer.check.core.result import LearnerError

if TYPE_CHECKING:
    from handformer.check.core.context import Context
    from handformer.check.core.discovery import Component

# the kinds that map a (B, T, d_model) input to the same shape
SAME_WIDTH = ("mha", "gqa", "causal_attention", "ffn", "layernorm", "rmsnorm", "block", "encoder_layer")


def first_width(module: nn.Module) -> int | None:
    """The input width of the module's first layer with weights: a Linear's in_features, a norm's
    width; None where it has none."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            return sub.in_features
        weight = getattr(sub, "weight", None)
        if sub is not module and isinstance(weight, nn.Parameter) and weight.dim() == 1:
            return weight.numel()  # a norm's gain
    return None


@torch.no_grad()
def other_width(comp: Component, ctx: Context, error: LearnerError) -> bool:
    """Whether the layer, built at check's sizes, takes another width than check's d_model and runs on
    it, giving that width back: then its exception (`error`, turned into a cannot_build that says so)
    was check's wrong reading of its sizes."""
    from handformer.check.core.discovery import build
    from handformer.check.core.sizes import SIZES, D
    from handformer.check.runners.attention import caller

    if comp.kind not in SAME_WIDTH or error.kind != "exception" or not inspect.isclass(comp.obj):
        return False
    try:
        with ctx.hyperparameters(comp):
            module = build(comp.obj, SIZES, ctx.parts(SIZES)).float().eval()
            width = first_width(module)
            if width in (None, D):
                return False
            x = torch.randn(2, 5, width)
            c = caller(module) if comp.kind in ("mha", "gqa", "causal_attention") else None
            out = c.call(x, x, x, None) if c is not None else module(x)
    except Exception:  # noqa: BLE001  (it raises at its own width too: the exception is theirs)
        return False
    out = out[0] if isinstance(out, tuple) else out
    if not isinstance(out, torch.Tensor) or out.shape[-1] != width:
        return False
    error.kind = "cannot_build"
    error.message_zh = (f"按检查程序读出的大小构建后，它的第一层接受宽度 {width}，不是检查程序的 d_model（{D}）："
                        f"检查程序读错了某个参数或配置字段的含义（原文：{error.message}）")
    error.message = (f"built at the sizes check read from its arguments' or config's names, its first layer "
                     f"takes width {width}, not check's d_model ({D}), and it runs at that width: check read "
                     f"one of those names wrongly ({error.message})")
    return True
