"""The pad id an encoder-decoder model is given (fairseq's padding_idx, bentrevett's src_pad_idx): a model
whose constructor takes one and that builds its masks itself from the tokens is built a second time with
a pad id other than 0 and the one check's inputs use, and its source padded with that id must change no
logit (a mask that compares with 0, not with the pad id it was given, lets the padding be attended).

Shape legend: B batch, S source length, T target length.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, moved_by
from handformer.check.core.defaults import quietly
from handformer.check.core.discovery import Component, DiscoveryError, size_of
from handformer.check.core.result import Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines

OTHER_PAD = 3  # neither 0 (check's) nor 1 (the translation tutorials'), so a pad id written as either shows


def takes_pad(comp: Component) -> bool:
    """Whether the model's constructor takes a pad id by one of its names."""
    params = quietly(lambda: inspect.signature(comp.obj).parameters, (TypeError, ValueError), ())
    return any(size_of(name) == "pad_id" for name in params)


def check_pad_given(res: ComponentResult, ctx: Context, comp: Component, sizes: dict[str, Any],
                    Caller: Callable, inputs: Callable) -> None:
    """The model built with pad id OTHER_PAD: its source padded with it changes no logit. Caller and
    inputs are the model runner's (handed in, so this room imports nothing back from it)."""
    src, tgt = inputs(7, 5, [0, 0], [0, 0], seed=2)
    src[src == OTHER_PAD], tgt[tgt == OTHER_PAD] = OTHER_PAD + 1, OTHER_PAD + 1  # the pad only where padded
    longer = torch.cat([src, torch.full((2, 3), OTHER_PAD)], dim=1)  # (B, S + 3)
    try:  # a model that cannot be built or run so: no check (its own check ran it at pad id 0)
        call = Caller(ctx.build(comp, {**sizes, "pad_id": OTHER_PAD}), ctx)
        moved = moved_by(call(longer, tgt), call(src, tgt), slice(None))
    except (DiscoveryError, fp.LearnerFailure):
        return
    res.checks.append(Check(text(f"built with pad id {OTHER_PAD}, padding its source with {OTHER_PAD} "
                                 "changes nothing",
                                 f"用 pad id {OTHER_PAD} 构造时，源端用 {OTHER_PAD} 填充不影响结果"),
                            moved < 1e-9, text(f"moved by {moved:.3g}", f"变化了 {moved:.3g}")))
    if moved >= 1e-9:
        number, code = locate("mask_pad_id", source_lines(ctx.objects(comp)))
        res.findings.append(Finding("mask_pad_id", text(
            f"built with pad id {OTHER_PAD}, its source padded with {OTHER_PAD} moves the logits by "
            f"{moved:.3g}: the padding mask does not compare with the pad id it was given",
            f"用 pad id {OTHER_PAD} 构造时，源端用 {OTHER_PAD} 填充，logits 变了 {moved:.3g}："
            "填充掩码没有和传入的 pad id 比较"), number, code))
