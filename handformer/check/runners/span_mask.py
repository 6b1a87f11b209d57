"""The runner of T5's span-corruption noise mask (Raffel et al. 2020, section 3.1.4; the T5 code's and
Hugging Face's `random_spans_noise_mask(length)`): a random boolean mask of a sequence's positions,
True where a token is noise, made of non-noise and noise spans interleaved, non-noise first.

Called 8 times at each of the lengths 20, 57, 100 and 128 with the noise density 0.15 and the mean
span length 3 (handed by name, or to the constructor of the collator whose method it is), each mask
must hold round(length * density) noise tokens (at least 1, at most length - 1) in
max(round(noise / mean), 1) spans, open with a non-noise token and close with a noise one.

Shape legend: L positions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from handformer.check.core.argument_names import call_parameters
from handformer.check.core.collators import as_bound
from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component, DiscoveryError, cannot_fill
from handformer.check.core.result import Check, ComponentResult, text

LENGTHS, DRAWS, DENSITY, MEAN = (20, 57, 100, 128), 8, 0.15, 3.0
VALUES = {**dict.fromkeys(("noise_density", "density", "mask_ratio", "corruption_rate", "noise_ratio"),
                         DENSITY),
          **dict.fromkeys(("mean_noise_span_length", "mean_span_length", "span_length", "mean_span"), MEAN),
          "vocab_size": 100, "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0,
          "input_length": 128, "target_length": 32}
TAKES = ("a noise-mask function takes the length, its settings by name (noise_density, "
         "mean_noise_span_length), and returns a boolean mask of that length",
         "噪声掩码函数接收长度，设置按名字传（noise_density、mean_noise_span_length），返回这个长度的布尔掩码")


def spans(mask: Tensor) -> int:
    """The number of noise spans: runs of True."""
    starts = mask[1:] & ~mask[:-1]
    return int(starts.sum()) + int(mask[0])


def expected(length: int) -> tuple[int, int]:
    """(noise tokens, noise spans) of a mask of `length` positions."""
    noise = min(max(round(length * DENSITY), 1), length - 1)
    return noise, max(round(min(noise, length - noise) / MEAN), 1)


# each check: what it says (en, zh), whether a mask of `length` positions holds it, what it found (en, zh)
CHECKS = (
    (("round(length * 0.15) noise tokens", "噪声 token 数是 round(length * 0.15)"),
     lambda m, n: int(m.sum()) == expected(n)[0],
     lambda m, n: (f"{int(m.sum())} of {n}, not {expected(n)[0]}",
                   f"{n} 个中有 {int(m.sum())} 个，应为 {expected(n)[0]} 个")),
    (("max(round(noise / 3), 1) noise spans", "噪声片段数是 max(round(noise / 3), 1)"),
     lambda m, n: spans(m) == expected(n)[1],
     lambda m, n: (f"{spans(m)} spans at length {n}, not {expected(n)[1]}",
                   f"长度 {n} 时有 {spans(m)} 个片段，应为 {expected(n)[1]} 个")),
    (("a non-noise token first and a noise token last (non-noise and noise spans interleaved, "
      "non-noise first)", "第一个 token 不是噪声、最后一个是噪声（非噪声片段和噪声片段交替，非噪声在前）"),
     lambda m, n: not bool(m[0]) and bool(m[-1]),
     lambda m, n: (f"first {bool(m[0])}, last {bool(m[-1])}",
                   f"第一个 {bool(m[0])}，最后一个 {bool(m[-1])}")),
)


def check_span_noise_mask(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    fn = as_bound(comp, ctx, VALUES.get, TAKES)
    params = call_parameters(fn)[1:]
    args = {p.name: VALUES[p.name] for p in params if p.name in VALUES}
    cannot_fill(comp.name, [p.name for p in params if p.default is p.empty], args, [comp.name], "", TAKES)
    torch.manual_seed(0)
    np.random.seed(0)
    masks = [(_mask(ctx, fn, n, args), n) for n in LENGTHS for _ in range(DRAWS)]
    for (en, zh), holds, seen in CHECKS:
        wrong = [(m, n) for m, n in masks if not holds(m, n)]
        said = seen(*wrong[0]) if wrong else ("", "")
        found = text(f"found {said[0]} ({len(wrong)} of {len(masks)} masks)",
                     f"实际 {said[1]}（{len(masks)} 个掩码中有 {len(wrong)} 个）") if wrong else None
        res.checks.append(Check(text(f"each mask: {en}", f"每个掩码：{zh}"), not wrong, found))
    return finish(res)


def _mask(ctx: Context, fn: Any, length: int, args: dict[str, Any]) -> Tensor:
    """The learner's mask of `length` positions as a (L,) bool tensor."""
    out = ctx.learner.call("forward", fn, length, **args)
    mask = torch.as_tensor(np.asarray(out)) if isinstance(out, (Tensor, np.ndarray, list)) else None
    if mask is None or mask.numel() != length:
        raise DiscoveryError(f"{fn.__name__}({length}) returned no mask of {length} positions; {TAKES[0]}",
                             zh=f"{fn.__name__}({length}) 返回的不是 {length} 个位置的掩码；{TAKES[1]}")
    return mask.bool().flatten()
