"""The Annotated Transformer's `Batch(src, tgt=None, pad=2)`: it holds the source's padding mask
(src_mask, (B, 1, S), True = a real token), the target shifted (tgt = tgt[:, :-1], tgt_y = tgt[:, 1:])
and its mask (tgt_mask, (B, T, T): the target's real tokens and the causal part, combined with &).

It is built on ids padded with the pad id 1 (not 0: a mask that assumes 0 shows it) and its masks
read back as keep masks (True or 1 = may be seen) and compared with those; a source mask that is the
one the pad id 0 would give is named.

Shape legend: B batch, S source length, T target length (one less than the target handed).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.context import Context, finish, forward_names
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.result import DEPARTS, Check, ComponentResult, Finding, text
from handformer.check.core.source import first_line, locate, source_lines
from handformer.check.runners.mask_helpers import PAD, PAD_NAMES, src_ids, tgt_ids


def _keep(mask: object, B: int, width: int) -> Tensor | None:
    """A mask read as (B, rows, width) keep, where it is a tensor of that many entries."""
    return mask.reshape(B, -1, width).bool() if isinstance(mask, Tensor) and mask.numel() % (B * width) == 0 \
        else None


def expected(ids: Tensor, pad: int, causal: bool) -> Tensor:
    """(B, 1, L) keep of the real tokens, with the causal part (B, L, L) where `causal`."""
    keep = (ids != pad)[:, None, :]
    return keep & torch.ones(ids.size(1), ids.size(1), dtype=torch.bool).tril() if causal else keep


# the masks a batch holds, by role: an attribute whose name says mask and the side it masks
# (the Annotated Transformer's src_mask and tgt_mask; trg_mask, source_mask, dec_mask, ...)
ROLES = {"src_mask": re.compile(r"src|source|enc", re.I), "tgt_mask": re.compile(r"tgt|trg|target|dec", re.I)}


NO_MASKS = ("{name} holds no source mask and target mask check can read (an attribute whose name says "
            "mask and its side: src_mask and tgt_mask, as the Annotated Transformer's; it holds {held}): "
            "name them so, or write an adapter that returns them",
            "{name} 里没有检查程序能读出的源掩码和目标掩码（属性名要说明是掩码以及哪一侧：像 Annotated "
            "Transformer 那样叫 src_mask 和 tgt_mask；它有 {held}）：请这样命名，或写一个返回它们的适配器")


def held_masks(batch: object) -> dict[str, str]:
    """role -> the name of the batch's attribute that holds that mask: the first tensor attribute whose
    name says mask and the role's side."""
    names = [n for n, v in vars(batch).items() if isinstance(v, Tensor) and "mask" in n.lower()]
    return {role: found for role, said in ROLES.items()
            if (found := next((n for n in names if said.search(n)), None))}


def check_batch(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    names = forward_names(comp.obj)
    pad = next((n for n in names if n in PAD_NAMES), None)
    cannot_fill(comp.name, [], (), [pad] * bool(pad), "pad", (
        "a Batch takes the source ids, the target ids and the pad id", "Batch 接收源 id、目标 id 和 pad id"))
    src, tgt = src_ids(PAD), tgt_ids(PAD)
    batch = ctx.learner.call("__init__", comp.obj, src, tgt, **{pad: PAD})
    held = held_masks(batch)
    if len(held) < len(ROLES):
        raise fp.cannot_call(*NO_MASKS, {"name": comp.name, "held": ", ".join(vars(batch)) or "nothing"})
    shifted, lines = tgt[:, :-1], source_lines([comp.obj])
    B = src.size(0)
    got = {"src_mask": _keep(getattr(batch, held["src_mask"]), B, src.size(1)),
           "tgt_mask": _keep(getattr(batch, held["tgt_mask"]), B, shifted.size(1))}
    zero_pad = got["src_mask"] is not None and torch.equal(got["src_mask"], expected(src, 0, False))
    wanted = {"src_mask": expected(src, PAD, False), "tgt_mask": expected(shifted, PAD, True)}
    _compare_masks(res, held, got, wanted, lines, zero_pad)
    if zero_pad:
        number, code = locate("mask_pad_id", lines)
        res.findings.append(Finding("mask_pad_id", text(
            f"built with {pad}={PAD}, its src_mask hides the tokens with id 0, not those with id {PAD}",
            f"传入 {pad}={PAD} 时，它的 src_mask 屏蔽的是 id 为 0 的 token，不是 id 为 {PAD} 的"),
            number, code))
    _labels(res, comp, batch, tgt)
    return finish(res)


def _compare_masks(res: ComponentResult, held: dict[str, str], got: dict[str, Tensor | None],
                   wanted: dict[str, Tensor], lines: list[tuple[int, str]], zero_pad: bool) -> None:
    """Each mask against its keep mask; one that is not it, at the line that sets it (a source mask of
    the pad id 0 is named by the caller)."""
    for role, keep in got.items():
        ok = keep is not None and keep.shape == wanted[role].shape and torch.equal(keep, wanted[role])
        name, target = held[role], role == "tgt_mask"
        res.checks.append(Check(text(f"{name}: the real tokens' keep mask (pad id {PAD})",
                                     f"{name}：真实 token 的保留掩码（pad id 为 {PAD}）"), ok))
        res.findings += [Finding(DEPARTS, text(
            f"{name} is not the {'target' if target else 'source'}'s keep mask: the real tokens (not pad id "
            f"{PAD})" + ", and the causal part" * target,
            f"{name} 不是{'目标' if target else '源'}的保留掩码：真实 token（不是 pad id {PAD}）"
            + "，再加上因果部分" * target),
            *first_line([rf"\bself\.{name}\s*="], lines))] * (not ok and not (zero_pad and not target))


def _labels(res: ComponentResult, comp: Component, batch: object, tgt: Tensor) -> None:
    """The target's ids the batch holds, (B, T - 1) each: the decoder's input tgt[:, :-1] and its labels
    tgt[:, 1:] (the Annotated Transformer's tgt and tgt_y). Where it holds two and neither is
    tgt[:, 1:], the labels are not moved on by one: train_step_no_shift, at the line that sets the
    last of them (the labels, set after the input)."""
    shape = (tgt.size(0), tgt.size(1) - 1)
    held = [name for name, v in vars(batch).items()
            if isinstance(v, Tensor) and v.shape == shape and v.dtype in (torch.int64, torch.int32)]
    if len(held) < 2:  # no labels kept beside the input: nothing to compare
        return
    ok = any(torch.equal(getattr(batch, name), tgt[:, 1:]) for name in held)
    res.checks.append(Check(text(f"{' and '.join(held)}: the decoder's input is tgt[:, :-1] and the labels "
                                 "are tgt[:, 1:], one position on", f"{'、'.join(held)}：解码器的输入是 "
                                 "tgt[:, :-1]，标签是 tgt[:, 1:]，错开一位"), ok))
    lines = source_lines([comp.obj])
    number, code = first_line([rf"\bself\.{held[-1]}\s*="], lines)
    res.findings += [Finding("train_step_no_shift", text(
        f"{held[-1]} (the labels: set after the input) is not tgt[:, 1:], the next tokens",
        f"{held[-1]}（标签：在输入之后赋值）不是 tgt[:, 1:]，不是下一个 token"), number, code)] * (not ok)
