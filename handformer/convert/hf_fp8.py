"""Checkpoints whose weights are stored in FP8 with block scales (DeepSeek-V3's release): read back
as bfloat16 at import.

config.json says so in `quantization_config`: quant_method "fp8", fmt "e4m3", weight_block_size
[128, 128]. Each quantized weight W (out, in) is then two tensors: `X.weight`, float8_e4m3fn values
Q, and `X.weight_scale_inv`, one float32 scale per 128 x 128 block, (ceil(out/128), ceil(in/128));
the blocks at the right and bottom edges may be smaller. The weight is

    W[i, j] = Q[i, j] * scale_inv[i // 128, j // 128]

computed in float32 and rounded to bfloat16, as DeepSeek's fp8_cast_bf16.py does. Any other
quantization (another method, format or block layout) is refused by name before a weight is read.

Shape legend: O out features, I in features, b0 x b1 the block.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

SCALE = ".weight_scale_inv"


def fp8_blocks(hf_config: dict[str, Any], mxfp4: bool = False) -> tuple[int, int] | None:
    """The block (b0, b1) of an FP8 checkpoint, None for an unquantized one (or an MXFP4 one when the
    family's tensor map reads MXFP4: `mxfp4`, gpt-oss's experts); any other quantization_config is a
    ValueError naming it."""
    q = hf_config.get("quantization_config")
    if q is None or (mxfp4 and isinstance(q, dict) and q.get("quant_method") == "mxfp4"):
        return None  # MXFP4 is dequantized by the tensor map (HFTensors.mxfp4, convert/mxfp4.py)
    method, fmt, block = (q.get(k) if isinstance(q, dict) else None
                          for k in ("quant_method", "fmt", "weight_block_size"))
    ok = (method == "fp8" and fmt in (None, "e4m3") and isinstance(block, list) and len(block) == 2
          and all(isinstance(b, int) and b > 0 for b in block))
    if not ok:
        raise ValueError(f"config.json has quantization_config={q!r}: handformer reads FP8 (e4m3) weights "
                         "with block scales (quant_method 'fp8', weight_block_size [b0, b1]), gpt-oss's "
                         "MXFP4 experts and unquantized ones; dequantize the checkpoint first (e.g. to "
                         "bfloat16)")
    return block[0], block[1]


def dequantize_block_fp8(q: Tensor, scale_inv: Tensor, block: tuple[int, int]) -> Tensor:
    """(O, I) float8 values and (ceil(O/b0), ceil(I/b1)) scales -> the (O, I) bfloat16 weight."""
    O, I = q.shape
    scales = scale_inv.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)  # (>= O, >= I)
    return (q.float() * scales[:O, :I]).to(torch.bfloat16)  # (O, I)


def dequantize_fp8(state: dict[str, Tensor], block: tuple[int, int]) -> dict[str, Tensor]:
    """The checkpoint's tensors with each FP8 weight and its scales replaced by the bfloat16 weight."""
    out = {k: v for k, v in state.items() if not k.endswith(SCALE)}
    for key in state:
        if not key.endswith(SCALE):
            continue
        name = key.removesuffix(SCALE) + ".weight"
        q, scale_inv = state.get(name), state[key]
        expected = tuple(-(-n // b) for n, b in zip(q.shape, block)) if q is not None else None
        if q is None or q.dtype != torch.float8_e4m3fn or tuple(scale_inv.shape) != expected:
            got = "absent" if q is None else f"{q.dtype} {tuple(q.shape)}"
            raise ValueError(f"{key} {tuple(scale_inv.shape)} does not scale an FP8 weight in blocks of "
                             f"{block[0]} x {block[1]}: {name} is {got}")
        out[name] = dequantize_block_fp8(q, scale_inv, block)
    unscaled = [k for k, v in out.items() if v.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)]
    if unscaled:
        raise ValueError(f"FP8 tensors without a {SCALE}: {', '.join(unscaled[:5])}")
    return out


__all__ = ["dequantize_block_fp8", "dequantize_fp8", "fp8_blocks"]
