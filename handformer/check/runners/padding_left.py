"""Left padding of a decoder-only model whose forward takes Hugging Face's 2-D `attention_mask` (1 = a
real token, 0 = padding): a batched prompt is padded at the start, so its real tokens come after the
pads, and the causal mask alone does not hide the pads from them (padding at the end it does).

The probe is position-free: row 1 padded with PADS tokens at the start, the real tokens' logits must
not move when only the padded tokens change (whatever positions the model gives the real tokens,
absolute, rotary or read from the mask). Where they move while the mask does change the padded places'
own logits and leaves the row without padding as a run with no padding marked gives it, the mask hid the
padded queries instead of the padded keys (mask_hides_queries). A forward that raises on the mask,
gives NaN on the real tokens, reads the mask the other way round (1 = padding: then the probe passes
with the mask inverted), or never reads it (its logits the same with no padding marked) is not judged
here.

Shape legend: B batch, T tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, error_text, forward_names
from handformer.check.core.discovery import Component
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text
from handformer.check.core.source import locate, source_lines

MASK_NAME = "attention_mask"  # Hugging Face's name, whose convention is 1 = a real token
PADS = 3  # padded places at the start of row 1
TOL = 1e-6


def left_padding(res: ComponentResult, ctx: Context, comp: Component, module: nn.Module,
                 run: Callable[[Tensor, Tensor], Any], idx: Tensor) -> None:
    """The left-padding probe on idx (B, T), `run(ids, attention_mask)` giving the logits (B, T, V);
    nothing where the forward takes no attention_mask or the probe cannot be judged."""
    if MASK_NAME not in forward_names(module) or idx.size(1) <= PADS + 1:
        return
    keep = torch.ones_like(idx)
    keep[1, :PADS] = 0
    other = idx.clone()
    other[1, :PADS] = (idx[1, :PADS] + 1) % (int(idx.max()) + 1)
    runs = _runs(run, [(idx, keep), (other, keep)])
    if runs is None or not torch.isfinite(runs[0][1, PADS:]).all():
        return
    err = fp.max_error(runs[0][1, PADS:], runs[1][1, PADS:])
    inverted = _runs(run, [(idx, 1 - keep), (other, 1 - keep), (idx, torch.ones_like(idx))]) \
        if err >= TOL else None
    if inverted is not None and fp.max_error(inverted[0][1, PADS:], inverted[1][1, PADS:]) < TOL:
        return  # it reads the mask as 1 = padding: a convention of its own
    if inverted is not None and fp.max_error(runs[0], inverted[2]) < TOL:
        return  # it takes the mask and never reads it: nothing to judge its padding by
    res.checks.append(Check(text(
        f"left padding: with attention_mask (1 = a real token) and {PADS} padded places at the start of a "
        "row, changing the padded tokens changes no real token's logits",
        f"左侧填充：给定 attention_mask（1 = 真实 token），某行开头有 {PADS} 个填充位置时，改变填充位置的 "
        "token 不改变任何真实 token 的 logits"), err < TOL, error_text(err)))
    if err >= TOL:
        res.findings.append(_finding(ctx, comp, err, runs[0], inverted and inverted[2]))


def _runs(run: Callable[[Tensor, Tensor], Any], calls: list[tuple[Tensor, Tensor]]) -> list[Tensor] | None:
    """The logits (B, T, V) of each (ids, attention_mask); None where one raises or has another shape."""
    outs = [fp.quietly(lambda ids=ids, m=m: run(ids, m)) for ids, m in calls]
    ok = all(isinstance(o, Tensor) and o.shape[:2] == calls[0][0].shape for o in outs)
    return outs if ok else None


def _finding(ctx: Context, comp: Component, err: float, masked: Tensor, unmarked: Tensor | None) -> Finding:
    """mask_hides_queries where the mask moves the padded row's own places and leaves the row without
    padding as it is with no padding marked; else where the real tokens first see the pads, unnamed."""
    if unmarked is not None and fp.max_error(masked[0], unmarked[0]) < TOL \
            and fp.max_error(masked[1, :PADS], unmarked[1, :PADS]) >= TOL:
        number, code = locate("mask_hides_queries", source_lines(ctx.objects(comp)))
        return Finding("mask_hides_queries", text(
            f"with left padding the real tokens' logits move by {err:.3g} when only the padded tokens "
            "change, while the mask does change the padded places' own logits: the mask hides the padded "
            "queries, not the padded keys",
            f"左侧填充时，只改变填充位置的 token，真实 token 的 logits 就变了 {err:.3g}，而掩码确实改变了"
            "填充位置自己的 logits：掩码屏蔽的是填充的查询，而不是填充的键"), number, code)
    return Finding(DEPARTS, text(
        f"with left padding the real tokens' logits move by {err:.3g} when only the padded tokens change: "
        "the real tokens still see the padded keys",
        f"左侧填充时，只改变填充位置的 token，真实 token 的 logits 就变了 {err:.3g}：真实 token 仍能看到"
        "填充的键"), None, None)
