"""MXFP4, the format gpt-oss's released checkpoints store their experts in (OCP Microscaling
Formats v1.0): blocks of 32 values share one scale.

Each value is FP4 (E2M1): a sign bit, two exponent bits and one mantissa bit, so one of
0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; two values a byte, the first in the low nibble. Each
block's scale is E8M0: a byte e meaning 2^(e - 127). A weight W (rows, cols) is stored as

    W_blocks  uint8 (rows, cols / 32, 16)   the 4-bit codes, 32 a block
    W_scales  uint8 (rows, cols / 32)       each block's exponent

and gpt-oss holds its experts' matrices (E, rows, cols) so, rows being the output features; the
dequantized weight is transposed to (E, cols, rows), the layout of the checkpoints written in
bfloat16 (transformers' `GptOssExperts`). Shape legend: E experts, G blocks a row (cols / 32).
"""

from __future__ import annotations

import torch
from torch import Tensor

# E2M1 codes 0-15 -> their values (bit 3 is the sign)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32  # values that share a scale
SCALE_BIAS = 127  # E8M0: a scale byte e means 2^(e - 127)


def dequantize(blocks: Tensor, scales: Tensor, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """(..., rows, G, 16) codes and (..., rows, G) scales -> (..., rows, G * 32) values, exact in
    bfloat16 (each is a 2-bit mantissa times a power of two)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} and scales "
                         f"{tuple(scales.shape)} {scales.dtype} do not match: expected uint8 (..., G, 16) "
                         "and uint8 (..., G)")
    table = torch.tensor(FP4_VALUES, dtype=torch.float32)
    low, high = table[(blocks & 0x0F).long()], table[(blocks >> 4).long()]  # (..., G, 16) each
    values = torch.stack([low, high], dim=-1).flatten(-2)  # (..., G, 32): low nibble first
    values = torch.ldexp(values, scales.long()[..., None] - SCALE_BIAS)  # times 2^(e - 127)
    return values.flatten(-2).to(dtype)  # (..., rows, G * 32)


def dequantize_mxfp4(state: dict[str, Tensor], keys: list[str]) -> dict[str, Tensor]:
    """Each of `keys` the checkpoint stores as `{key}_blocks` and `{key}_scales` (E, rows, G, 16)
    and (E, rows, G), dequantized into `{key}` (E, cols, rows); the others are left as they are."""
    for key in keys:
        if f"{key}_blocks" in state and f"{key}_scales" in state:
            blocks, scales = state.pop(f"{key}_blocks"), state.pop(f"{key}_scales")
            experts = [dequantize(b, s).t() for b, s in zip(blocks, scales)]  # (cols, rows), one at a time
            state[key] = torch.stack(experts)  # (E, cols, rows)
    return state


__all__ = ["BLOCK", "FP4_VALUES", "dequantize", "dequantize_mxfp4"]
