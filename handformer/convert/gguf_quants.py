"""GGML's tensor encodings, written out by hand: Q8_0 and Q4_0 to write, F32, F16, BF16, Q8_0, Q4_0,
Q4_K, Q5_K, Q6_K and MXFP4 to read back as float32, and Q4_0 to read back kept 4-bit (for Int4Linear).

GGML quantizes each row of a weight in blocks. Every block stores one or two float16 scales and a
few bits per weight; the layouts are llama.cpp's `block_*` structs (ggml-common.h), read here
byte by byte. Shapes: a row of K weights is K / 32 blocks (Q8_0, Q4_0) or K / 256 super-blocks
(the K-quants), so K must be a multiple of that block size.

    Q8_0  34 bytes / 32 weights:  d (f16), q[32] (int8)                 w = d * q
    Q4_0  18 bytes / 32 weights:  d (f16), 16 bytes of nibbles          w = d * (q - 8)
          (byte j holds weight j in its low nibble and weight j + 16 in its high nibble)
    Q4_K  144 bytes / 256 weights: d, dmin (f16), 12 bytes of 6-bit scales and mins for 8
          sub-blocks of 32, 128 bytes of nibbles                        w = d * sc * q - dmin * m
    Q5_K  176 bytes / 256 weights: as Q4_K plus 32 bytes holding each weight's fifth bit
    Q6_K  210 bytes / 256 weights: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs,
          16 int8 scales (one per 16 weights), d (f16)                  w = d * sc * (q - 32)
    MXFP4 17 bytes / 32 weights:  e (E8M0), 16 bytes of nibbles         w = 2^(e - 127) * fp4(q)
          (nibbles as Q4_0's; fp4 is E2M1, one of 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives:
          gpt-oss's experts, as llama.cpp's converter repacks them from the checkpoint)

Quantizing to Q8_0 follows llama.cpp's reference `quantize_row_q8_0_ref`: d = max|w| / 127 in
float32, q = w / d rounded half away from zero (C's roundf), d stored as float16. The products
are computed in the reference's order, in float32, so the results are the same bits as llama.cpp's
own (tests/test_gguf.py checks both directions against the `gguf` package).

Quantizing to Q4_0 follows `quantize_row_q4_0_ref`: the block's value of largest magnitude (the
first, on a tie) is `peak`, d = peak / -8, q = min(15, trunc(w / d + 8.5)) in float32, so the peak
itself becomes q = 0 and d keeps its sign. `q4_0_to_int4` hands the blocks to
inference/quant_int4.py's Int4Linear as they are: its w = (Q - 8) * scale + zero with Q = q,
scale = d and zero = 0 is Q4_0's w = d * (q - 8), the same float32 bits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

QK8_0 = QK4_0 = 32  # weights per block of Q8_0 and Q4_0
QK_K = 256  # weights per super-block of the K-quants

# type name -> (weights per block, bytes per block), as GGML defines them
BLOCKS: dict[str, tuple[int, int]] = {
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34), "Q4_0": (32, 18),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "MXFP4": (32, 17),
}


def round_half_away(x: Tensor) -> Tensor:
    """C's roundf: halves go away from zero (torch.round goes to even). Exact in float32:
    |x| - floor(|x|) is computed without rounding."""
    a = x.abs()
    whole = a.floor()
    return torch.copysign(whole + (a - whole >= 0.5).to(x.dtype), x)


def quantize_q8_0(weight: Tensor) -> Tensor:
    """A float tensor whose last dimension is a multiple of 32 -> its Q8_0 bytes, (..., K / 32 * 34)."""
    if weight.shape[-1] % QK8_0:
        raise ValueError(f"Q8_0 needs rows that are a multiple of {QK8_0} long, got {weight.shape[-1]}")
    blocks = weight.detach().to(torch.float32).reshape(-1, QK8_0)  # (nb, 32)
    d = blocks.abs().amax(dim=1, keepdim=True) / 127  # (nb, 1)
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = round_half_away(blocks * inverse).to(torch.int8)  # (nb, 32), |q| <= 127
    packed = torch.cat([d.to(torch.float16).view(torch.uint8), q.view(torch.uint8)], dim=1)  # (nb, 34)
    return packed.reshape(*weight.shape[:-1], weight.shape[-1] // QK8_0 * 34)


def quantize_q4_0(weight: Tensor) -> Tensor:
    """A float tensor whose last dimension is a multiple of 32 -> its Q4_0 bytes, (..., K / 32 * 18)."""
    if weight.shape[-1] % QK4_0:
        raise ValueError(f"Q4_0 needs rows that are a multiple of {QK4_0} long, got {weight.shape[-1]}")
    blocks = weight.detach().to(torch.float32).reshape(-1, QK4_0)  # (nb, 32)
    peak = blocks.gather(1, blocks.abs().argmax(dim=1, keepdim=True))  # (nb, 1), signed
    d = peak / -8
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = torch.trunc(blocks * inverse + 8.5).clamp(0, 15).to(torch.uint8)  # (nb, 32), 0..15
    nibbles = q[:, :16] | (q[:, 16:] << 4)  # (nb, 16): weight j low, weight j + 16 high
    packed = torch.cat([d.to(torch.float16).view(torch.uint8), nibbles], dim=1)  # (nb, 18)
    return packed.reshape(*weight.shape[:-1], weight.shape[-1] // QK4_0 * 18)


def q4_0_to_int4(raw: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """A tensor's Q4_0 bytes and its (..., K) shape -> ((..., K) uint8 values 0..15, (..., K / 32)
    float32 scales d): Int4Linear's values and scales in groups of 32 (its zeros are 0)."""
    if not shape or shape[-1] % QK4_0:
        raise ValueError(f"Q4_0 rows must be a multiple of {QK4_0} long, got shape {shape}")
    n = 1
    for size in shape:
        n *= size
    if raw.numel() != n // QK4_0 * 18:
        raise ValueError(f"Q4_0 data of shape {shape} needs {n // QK4_0 * 18} bytes, got {raw.numel()}")
    blocks = raw.reshape(-1, 18)  # (nb, 18)
    qs = blocks[:, 2:]  # (nb, 16)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=1)  # (nb, 32): weights 0..15, then 16..31
    return q.reshape(shape), _f16(blocks[:, :2]).reshape(*shape[:-1], shape[-1] // QK4_0)


def _f16(raw: Tensor) -> Tensor:
    """(..., 2) bytes -> (..., 1) float32: a little-endian float16 each."""
    return raw.contiguous().view(torch.float16).to(torch.float32)


def _dequantize_q8_0(blocks: Tensor) -> Tensor:  # (nb, 34) -> (nb, 32)
    return _f16(blocks[:, :2]) * blocks[:, 2:].contiguous().view(torch.int8).to(torch.float32)


def _dequantize_q4_0(blocks: Tensor) -> Tensor:  # (nb, 18) -> (nb, 32)
    qs = blocks[:, 2:]  # (nb, 16)
    q = torch.cat([qs & 0x0F, qs >> 4], dim=1).to(torch.int8) - 8  # weights 0..15, then 16..31
    return _f16(blocks[:, :2]) * q.to(torch.float32)


def _scales_and_mins(packed: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K / Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins, (nb, 8) each.
    Sub-blocks 0-3 keep theirs in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); sub-blocks
    4-7 in the nibbles of bytes 8-11, with the two top bits in the high bits of bytes 0-3 / 4-7."""
    low, mid, high = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]  # (nb, 4) each
    scales = torch.cat([low & 63, (high & 0x0F) | ((low >> 6) << 4)], dim=1)
    mins = torch.cat([mid & 63, (high >> 4) | ((mid >> 6) << 4)], dim=1)
    return scales.to(torch.float32), mins.to(torch.float32)


def _dequantize_q4_k(blocks: Tensor) -> Tensor:  # (nb, 144) -> (nb, 256)
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])  # (nb, 1)
    scales, mins = _scales_and_mins(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(-1, 4, 32)  # 4 chunks of 32 bytes: sub-blocks 2j (low) and 2j+1 (high)
    q = torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 8, 32).to(torch.float32)  # (nb, 8, 32)
    return ((d * scales)[..., None] * q - (dmin * mins)[..., None]).reshape(-1, QK_K)


def _dequantize_q5_k(blocks: Tensor) -> Tensor:  # (nb, 176) -> (nb, 256)
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    scales, mins = _scales_and_mins(blocks[:, 4:16])
    qh = blocks[:, 16:48]  # (nb, 32): bit s of byte l is the fifth bit of weight l of sub-block s
    qs = blocks[:, 48:].reshape(-1, 4, 32)
    low = torch.stack([qs & 0x0F, qs >> 4], dim=2).reshape(-1, 8, 32)  # (nb, 8, 32)
    bit = torch.stack([(qh >> s) & 1 for s in range(8)], dim=1)  # (nb, 8, 32)
    q = (low | (bit << 4)).to(torch.float32)
    return ((d * scales)[..., None] * q - (dmin * mins)[..., None]).reshape(-1, QK_K)


def _dequantize_q6_k(blocks: Tensor) -> Tensor:  # (nb, 210) -> (nb, 256)
    ql = blocks[:, 0:128].reshape(-1, 2, 64)  # two halves of 128 weights
    qh = blocks[:, 128:192].reshape(-1, 2, 32)
    scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)  # (nb, 16)
    d = _f16(blocks[:, 208:210])  # (nb, 1)
    # In each half, weight l (l < 32) of the four quarters: low nibble of ql[l], of ql[l + 32],
    # high nibble of ql[l], of ql[l + 32]; their top two bits are bits 0-1, 2-3, 4-5, 6-7 of qh[l].
    low = torch.stack([ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4],
                      dim=2)  # (nb, 2, 4, 32)
    top = torch.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=2)  # (nb, 2, 4, 32)
    q = ((low | (top << 4)).to(torch.int8) - 32).to(torch.float32).reshape(-1, 16, 16)  # (nb, 16, 16)
    return ((d * scales)[..., None] * q).reshape(-1, QK_K)


# E2M1 codes 0..15 doubled, so that they are whole numbers (code 8 is +0, as in llama.cpp's table)
_FP4_DOUBLED = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def _e8m0_half(e: Tensor) -> Tensor:
    """(nb, 1) exponent bytes -> 2^(e - 127) / 2 in float32, built from its bits as ggml does (e 0 and 1
    give the subnormals 2^-128 and 2^-127; 255 gives 2^127), so no rounding happens on the way."""
    e = e.to(torch.int32)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.view(torch.float32)


def _dequantize_mxfp4(blocks: Tensor) -> Tensor:  # (nb, 17) -> (nb, 32)
    qs = blocks[:, 1:]  # (nb, 16): weight j low, weight j + 16 high
    codes = torch.cat([qs & 0x0F, qs >> 4], dim=1).long()  # (nb, 32)
    values = torch.tensor(_FP4_DOUBLED, dtype=torch.float32)[codes]
    return _e8m0_half(blocks[:, :1]) * values  # one float32 product, as gguf's and llama.cpp's


_DEQUANTIZE: dict[str, Callable[[Tensor], Tensor]] = {
    "Q8_0": _dequantize_q8_0, "Q4_0": _dequantize_q4_0, "Q4_K": _dequantize_q4_k,
    "Q5_K": _dequantize_q5_k, "Q6_K": _dequantize_q6_k, "MXFP4": _dequantize_mxfp4,
}


def dequantize(raw: Tensor, type_name: str, shape: tuple[int, ...]) -> Tensor:
    """A tensor's bytes in the file (uint8) -> float32 of `shape` (PyTorch order: rows last).
    `type_name` is one of BLOCKS; ValueError if the byte count does not fit the shape."""
    per_block, block_bytes = BLOCKS[type_name]
    n = 1
    for size in shape:
        n *= size
    if shape and shape[-1] % per_block:
        raise ValueError(f"{type_name} rows must be a multiple of {per_block} long, got {shape[-1]}")
    if raw.numel() != n // per_block * block_bytes:
        raise ValueError(f"{type_name} data of shape {shape} needs {n // per_block * block_bytes} bytes, "
                         f"got {raw.numel()}")
    raw = raw.reshape(-1).contiguous()
    if type_name == "F32":
        out = raw.view(torch.float32).clone()
    elif type_name == "F16":
        out = raw.view(torch.float16).to(torch.float32)
    elif type_name == "BF16":
        out = raw.view(torch.bfloat16).to(torch.float32)  # exact: bf16 is float32's top half
    else:
        out = _DEQUANTIZE[type_name](raw.reshape(-1, block_bytes))
    return out.reshape(shape)


__all__ = ["BLOCKS", "QK4_0", "QK8_0", "QK_K", "dequantize", "q4_0_to_int4", "quantize_q4_0", "quantize_q8_0",
           "round_half_away"]
