"""The runner of a blockwise absmax quantization (QLoRA's NF4, bitsandbytes' `quantize_4bit` /
`quantize_blockwise`, a plain int8 or int4 per block): a function that quantizes a tensor and the
`dequantize_...` function beside it that gives it back.

No code (NF4, FP4, a linear grid, the 8-bit dynamic map) is assumed: a weight of blocks whose scales
and signs differ (the largest magnitude negative in half of them) goes through quantize then
dequantize, and each value must come back within half the widest gap between the levels a block gives
back, times its block's absmax, and never more than a code of its width allows: 0.18 for a code of 16
levels or fewer a block (the widest half-gap of NF4 is 0.152, of FP4 0.167), 0.02 for a wider one
(8-bit). The absmax of a doubly quantized file comes back with an
8-bit error: 0.01 of the largest absmax is allowed on top. A block size the function takes is set to
64; where it takes none, every block has the same scale, so any block size reads the same absmax.

Shape legend: N blocks, K values a block.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.argument_names import call_parameters
from handformer.check.core.context import Context, finish
from handformer.check.core.discovery import Component, DiscoveryError, cannot_fill
from handformer.check.core.result import Check, ComponentResult, text

N, K = 8, 64
SCALES = (0.05, 0.3, 1.0, 4.0, 0.5, 2.0, 0.1, 8.0)  # a block's absmax
BLOCK_NAMES = ("blocksize", "block_size", "group_size", "groupsize")
SHAPE_NAMES = ("shape", "orig_shape", "original_shape")
NARROW, WIDE, DOUBLE = 0.18, 0.02, 0.01  # half-gaps of a 16-level and an 8-bit code; double quantization
TAKES = ("a quantize function takes the tensor (a block size may be named blocksize, block_size or "
         "group_size), its other arguments with defaults; the dequantize function beside it takes what it "
         "returns",
         "量化函数接收张量（块大小可以叫 blocksize、block_size 或 group_size），其他参数要有默认值；"
         "旁边的反量化函数接收它的返回值")


def check_quantize(comp: Component, ctx: Context) -> ComponentResult:
    res = ctx.result(comp)
    back = _dequantizer(comp)
    weight, absmax = blocks(bool(_named_in(comp.obj, BLOCK_NAMES)))
    out = _round_trip(ctx, comp.obj, back, weight)
    if out.numel() != weight.numel():
        raise DiscoveryError(
            f"{comp.name}: dequantizing gave {out.numel()} values for {weight.numel()}; {TAKES[0]}",
            zh=f"{comp.name}：反量化得到 {out.numel()} 个值，输入有 {weight.numel()} 个；{TAKES[1]}")
    got = out.detach().double().reshape(N, K)
    gap = half_gap(got / absmax[:, None])
    allowed = gap * absmax[:, None] + DOUBLE * absmax.max()  # (N, 1)
    worst = ((got - weight.double().reshape(N, K)).abs() / allowed).max().item()
    low, high = absmax.min().item(), absmax.max().item()
    res.checks.append(Check(
        text(f"quantize then dequantize gives each value back within {gap:.3f} of its block's absmax (half "
             f"the widest gap between the levels it gives back), 64-value blocks of absmax {low:g} to "
             f"{high:g}, the largest magnitude negative in half of them",
             f"先量化再反量化，每个值的误差不超过所在块 absmax 的 {gap:.3f}"
             "（它给出的相邻量化级最大间隔的一半），"
             f"每块 64 个值，absmax 从 {low:g} 到 {high:g}，一半的块里绝对值最大的是负数"),
        worst <= 1.0, text(f"the worst value is off by {worst:.2f} times what is allowed",
                           f"最差的值偏差是允许值的 {worst:.2f} 倍")))
    return finish(res)


def half_gap(levels: Tensor) -> float:
    """Half the widest gap between neighbouring levels that any block (a row of `levels`, the values
    given back over the block's absmax) gives back, at most that of a code of its width: the levels of
    one block are its code's, scaled alike, where those pooled from blocks of a doubly quantized absmax
    would not be."""
    rows = [torch.unique(row.round(decimals=5)) for row in levels]
    widest = max((row.diff().max().item() for row in rows if len(row) > 1), default=2 * NARROW)
    return min(widest / 2, NARROW if max(map(len, rows)) <= 16 else WIDE)


def blocks(sized: bool) -> tuple[Tensor, Tensor]:
    """An (8, 64) weight (a row a block, whether blocks run over the flat tensor or along its rows) whose
    64-value blocks are a shuffled ramp from -1 to 0.5, times a sign and a
    scale each (every scale 1 where the block size cannot be set), and each block's absmax (N,)."""
    gen = torch.Generator().manual_seed(0)
    ramp = torch.linspace(-1.0, 0.5, K)
    rows = torch.stack([ramp[torch.randperm(K, generator=gen)] for _ in range(N)])  # (N, K)
    signs = torch.tensor([1.0, -1.0] * (N // 2))[:, None]
    scales = torch.tensor(SCALES if sized else (1.0,) * N)[:, None]
    return rows * signs * scales, scales.flatten().double()


def _round_trip(ctx: Context, quantize: Any, dequantize: Any, weight: Tensor) -> Tensor:
    """dequantize(quantize(weight)), the quantized form handed back whole or unpacked as it came."""
    sizes = {n: K for n in _named_in(quantize, BLOCK_NAMES)}
    packed = ctx.learner.call("forward", quantize, weight.clone(), **sizes)
    filled = call_parameters(dequantize)
    parts = packed if isinstance(packed, tuple) and len(filled) >= len(packed) else (packed,)
    rest = {p.name: (K if p.name.lower() in BLOCK_NAMES else weight.shape) for p in filled[len(parts):]
            if p.name.lower() in BLOCK_NAMES + SHAPE_NAMES}
    unknown = [p.name for p in filled[len(parts):] if p.default is p.empty and p.name not in rest]
    cannot_fill(dequantize.__name__, unknown, (), [dequantize.__name__], "", TAKES)
    out = ctx.learner.call("forward", dequantize, *parts, **rest)
    if not isinstance(out, Tensor):
        name = dequantize.__name__
        raise DiscoveryError(f"{name} returned a {type(out).__name__}, not a tensor; {TAKES[0]}",
                             zh=f"{name} 返回的是 {type(out).__name__}，不是张量；{TAKES[1]}")
    return out


def _named_in(fn: Any, names: tuple[str, ...]) -> list[str]:
    """fn's parameters among `names` (whatever their case)."""
    return [p.name for p in call_parameters(fn) if p.name.lower() in names]


def _dequantizer(comp: Component) -> Any:
    """The dequantize function beside a quantize one: its name with `quantize` made `dequantize`, else
    a function named `dequantize` alone."""
    fn = comp.obj
    others = getattr(fn, "__globals__", {})
    name = re.sub(r"(?i)(?<![a-z])quantize", lambda m: "de" + m.group(0), fn.__name__)
    name = next((n for n in (name, re.sub(r"(?i)quantize", "dequantize", fn.__name__), "dequantize")
                 if inspect.isfunction(others.get(n))), name)
    rest = [p.name for p in call_parameters(fn)[1:] if p.default is p.empty]
    cannot_fill(comp.name, rest, (), [comp.name], "", TAKES)
    if not inspect.isfunction(others.get(name)):
        raise DiscoveryError(
            f"{comp.name}: no function {name} beside it to give its output back; check grades a "
            "quantization by its round trip through the pair",
            zh=f"{comp.name}：旁边没有把输出还原的函数 {name}；check 通过这对函数的往返来检查量化")
    return others[name]
