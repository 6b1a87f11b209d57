"""Weight-only int4 quantization of linear layers, in groups along the input: asymmetric, 4 bits.

Each row n of a weight W (N, K) is cut into groups of g consecutive inputs (g = 32, 64, 128 or
256); each group gets its own scale and offset from its smallest and largest value:

    scale = (max - min) / 15
    Q     = clamp(round((W - min) / scale), 0, 15)                  (4 bits)
    W    ~= (Q - 8) * scale + zero,   zero = min + 8 * scale

(the `zero` form is the one PyTorch's int4 kernel takes). Small groups follow the weights' local
range, which 4 bits need: one scale per row (as int8 uses) loses too much.

Storage: `weight` (N, K/2) uint8, two 4-bit values a byte (even input in the low nibble), plus
`scales` and `zeros` (N, K/g) float32: portable across machines. The kernel's own layout
(`_convert_weight_to_int4pack_for_cpu`) depends on the CPU, so it is built at the first forward
and rebuilt only when the stored tensors change.

Kernels: "auto" (the default) runs "vnni" for one or two rows of activations (decoding at batch 1
or 2) where it can, else "int4pack-bf16". "vnni" (handformer/inference/vnni_matvec.c, built with gcc
at first use) serves the symmetric form every Q4_0 file holds (`import-gguf --int4`: zeros 0, so
w = d * (q - 8)) in groups of 32 with float16-exact scales: it reads the stored nibbles as they are
and a float16 copy of the scales (18 bytes a group of 32, as the Q4_0 file), rounds the activation
row to int8 in blocks of 32, and sums the products in integers by AVX-512 VNNI (vpdpbusd), the
nibbles unpacked in registers. Where it cannot run (no VNNI, no gcc, other zeros, groups or scales,
inside torch.compile) the layer runs "int4pack-bf16".
"int4pack-bf16" runs `torch.ops.aten._weight_int4pack_mm_for_cpu` with bf16 activations,
scales and outputs (cast back); it needs N to be a multiple of 16, so other heights are padded
with zero rows that are cut from the result. "dequant" rebuilds the float weight and calls
`F.linear` (any device, exact in fp32). Shape legend: N outputs, K inputs, G = K / g groups,
M activation rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.inference import c_kernels

GROUP_SIZES = (32, 64, 128, 256)  # the group sizes torch's CPU int4 kernel accepts
INT4_KERNELS = ("int4pack-bf16", "dequant", "auto", "vnni")
VNNI_GROUP = 32  # the VNNI kernel's group size: a Q4_0 block
_N_MULTIPLE = 16  # the CPU kernel packs rows in blocks of 16


def check_group_size(group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group size is {group_size!r}; choose one of "
                         f"{', '.join(map(str, GROUP_SIZES))}")


def quantize_int4(weight: Tensor, group_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """(N, K) float weight -> ((N, K) uint8 values 0..15, (N, G) scales, (N, G) zeros)."""
    check_group_size(group_size)
    N, K = weight.shape
    if K % group_size:
        raise ValueError(f"int4 groups of {group_size} need the input width to be a multiple of "
                         f"{group_size}; this layer has {K}")
    w = weight.detach().float().view(N, K // group_size, group_size)  # (N, G, g)
    lo, hi = w.amin(-1), w.amax(-1)  # (N, G)
    scales = ((hi - lo) / 15).clamp(min=torch.finfo(torch.float32).tiny)  # (N, G)
    q = torch.round((w - lo[..., None]) / scales[..., None]).clamp(0, 15).to(torch.uint8)  # (N, G, g)
    return q.view(N, K), scales, lo + 8 * scales


def dequantize_int4(q: Tensor, scales: Tensor, zeros: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """(N, K) values 0..15 and (N, G) scales and zeros -> the (N, K) weight they stand for."""
    N, K = q.shape
    G = scales.shape[1]
    w = (q.view(N, G, K // G).float() - 8) * scales[..., None] + zeros[..., None]  # (N, G, g)
    return w.view(N, K).to(dtype)


def pack_nibbles(q: Tensor) -> Tensor:
    """(N, K) uint8 values 0..15 -> (N, K/2) bytes, the even input in the low nibble."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_nibbles(packed: Tensor) -> Tensor:
    """(N, K/2) bytes -> (N, K) uint8 values 0..15."""
    return torch.stack([packed & 15, packed >> 4], dim=-1).view(packed.shape[0], -1)  # (N, K)


_HAS_INT4PACK = hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")  # once: torch.ops lookups are slow


class Int4Linear(nn.Module):
    """A drop-in `nn.Linear` with 4-bit weights in groups. State dict: `weight` (N, K/2) uint8,
    `scales` and `zeros` (N, K/g) float32, and `bias` (N,) when the layer has one."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group_size: int = 32,
                 kernel: str = "auto") -> None:
        super().__init__()
        check_group_size(group_size)
        if in_features % group_size:
            raise ValueError(f"int4 groups of {group_size} need in_features to be a multiple of "
                             f"{group_size}, got {in_features}")
        if kernel not in INT4_KERNELS:
            raise ValueError(f"Int4Linear kernel is {kernel!r}; choose one of {', '.join(INT4_KERNELS)}")
        self.in_features, self.out_features = in_features, out_features
        self.group_size, self.kernel = group_size, kernel
        G = in_features // group_size
        self.register_buffer("weight", torch.full((out_features, in_features // 2), 0x88, dtype=torch.uint8))
        self.register_buffer("scales", torch.ones(out_features, G))
        self.register_buffer("zeros", torch.zeros(out_features, G))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self._packed: tuple[tuple[int, ...], Tensor, Tensor] | None = None
        self._vnni_scales: tuple[tuple[int, ...], Tensor | None] | None = None
        self._vnni: tuple[tuple, tuple, tuple[int | None, ...]] | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 32, kernel: str = "auto",
                    ) -> Int4Linear:
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group_size, kernel)
        q, scales, zeros = quantize_int4(linear.weight, group_size)
        layer.weight.copy_(pack_nibbles(q))
        layer.scales.copy_(scales)
        layer.zeros.copy_(zeros)
        if linear.bias is not None:
            layer.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        return layer.to(linear.weight.device)

    def _kernel_weights(self) -> tuple[Tensor, Tensor]:
        """The CPU kernel's packed weight and (G, N', 2) bf16 scales-and-zeros, N' = N padded to 16."""
        key = (*c_kernels.stamp(self.weight), *c_kernels.stamp(self.scales), *c_kernels.stamp(self.zeros))
        if self._packed is None or self._packed[0] != key:
            pad = -self.out_features % _N_MULTIPLE
            q = F.pad(unpack_nibbles(self.weight).to(torch.int32), (0, 0, 0, pad), value=8)  # (N', K)
            scales = F.pad(self.scales, (0, 0, 0, pad))  # (N', G)
            zeros = F.pad(self.zeros, (0, 0, 0, pad))  # (N', G)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            scales_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(torch.bfloat16).contiguous()
            self._packed = (key, packed, scales_zeros)  # (G, N', 2)
        return self._packed[1], self._packed[2]

    def vnni_scales(self) -> Tensor | None:
        """The (N, G) float16 scales the VNNI kernel reads, or None where it cannot serve this layer
        (zeros not all 0, groups other than 32, a scale float16 cannot hold exactly); kept until the
        stored tensors change."""
        key = (*c_kernels.stamp(self.scales), *c_kernels.stamp(self.zeros))
        if self._vnni_scales is None or self._vnni_scales[0] != key:
            half = self.scales.to(torch.float16)
            exact = (self.group_size == VNNI_GROUP and self.scales.is_cpu and not self.zeros.any()
                     and torch.equal(half.float(), self.scales))
            self._vnni_scales = (key, half.contiguous() if exact else None)
        return self._vnni_scales[1]

    def _vnni_weights(self, d: Tensor) -> tuple[int | None, ...]:
        """The addresses the VNNI kernel reads (nibbles, float16 scales `d`, fp32 bias), kept while
        the layer holds the same tensor objects."""
        tensors = (self._buffers["weight"], d, self._parameters.get("bias"))
        if self._vnni is None or any(a is not b for a, b in zip(self._vnni[0], tensors)):
            weight, _, bias = tensors
            kept = (weight.contiguous(), d, None if bias is None else bias.detach().float().contiguous())
            self._vnni = (tensors, kept, c_kernels.pointers(*kept))
        return self._vnni[2]

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., K) -> (..., N)."""
        if self.kernel in ("auto", "vnni"):
            rows = None if self.kernel == "vnni" else c_kernels.MAX_ROWS
            if (c_kernels.usable("int4_vnni_linear", x, self.in_features, rows)
                    and (d := self.vnni_scales()) is not None):
                flat = x.reshape(-1, self.in_features).contiguous()  # (M, K)
                y = c_kernels.vnni_linear("int4_vnni_linear", flat, self._vnni_weights(d), self.out_features)
                return y.view(*x.shape[:-1], self.out_features)  # (..., N)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.kernel != "dequant" and x.is_cpu and _HAS_INT4PACK:
            packed, scales_zeros = self._kernel_weights()
            rows = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()  # (M, K)
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, packed, self.group_size, scales_zeros)
            y = y[:, : self.out_features].to(x.dtype).reshape(*x.shape[:-1], self.out_features)  # (..., N)
            return y if bias is None else y + bias
        weight = dequantize_int4(unpack_nibbles(self.weight), self.scales, self.zeros, x.dtype)
        return F.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, group_size={self.group_size}, kernel={self.kernel!r}")


__all__ = ["GROUP_SIZES", "INT4_KERNELS", "VNNI_GROUP", "Int4Linear", "check_group_size", "dequantize_int4",
           "pack_nibbles", "quantize_int4", "unpack_nibbles"]
