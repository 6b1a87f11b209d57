"""A layer check built at a width its code does not take: the sizes check read from the names of its
constructor's arguments or its config's fields were not the ones its code uses (a config's `hidden`
read as the FFN's width where it is the model's). Its exception on check's input is then check's
guess, not the learner's mistake: where the layer, built the same way, runs on an input of the width
its own first layer takes and gives back that width (what a residual layer does), it is NOT CHECKED,
the width said."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.result import LearnerError

if TYPE_CHECKING:
    from handformer.check.core.context import Context
    from handformer.check.core.discovery import Component

Run = Callable[["Component", nn.Module], Callable[[torch.Tensor], Any]]  # how a layer is called on one input


def other_width(comp: Component, ctx: Context, error: LearnerError, run: Run) -> bool:
    """Whether the layer (one of the kinds that map a (B, T, d_model) input to that shape, whose forward
    raised on check's plain input: engine.py's raises_alone), built at check's sizes, takes another
    width than check's d_model (its first Linear's) and, called by `run` on that width, gives that
    width back: then its exception (`error`, turned into a cannot_build that says so) was check's
    wrong reading of its sizes."""
    from handformer.check.core.sizes import D

    out, width = fp.quietly(lambda: _at_own_width(comp, ctx, run)) or (None, D)
    if getattr(out, "shape", (0,))[-1] != width:  # (at check's own width it raised: no output)
        return False
    error.kind = "cannot_build"
    error.message_zh = (f"按检查程序读出的大小构建后，它的第一层接受宽度 {width}，"
                        f"不是检查程序的 d_model（{D}），而在这个宽度上能运行："
                        f"检查程序读错了某个参数或配置字段的含义（原文：{error.message}）")
    error.message = (f"built at the sizes check read from its arguments' or config's names, its first layer "
                     f"takes width {width}, not check's d_model ({D}), and it runs at that width: check read "
                     f"one of those names wrongly ({error.message})")
    return True


@torch.no_grad()
def _at_own_width(comp: Component, ctx: Context, run: Run) -> tuple[Any, int]:
    """(its output, the width) of the layer built at check's sizes, on an input of its first Linear's
    width."""
    from handformer.check.core.discovery import build
    from handformer.check.core.sizes import SIZES

    with ctx.hyperparameters(comp):
        module = build(comp.obj, SIZES, ctx.parts(SIZES)).float().eval()
        width = next(m.in_features for m in module.modules() if isinstance(m, nn.Linear))
        out = run(comp, module)(torch.randn(2, 5, width, generator=torch.Generator().manual_seed(0)))
    return fp.first_tensor(out, 3), width
