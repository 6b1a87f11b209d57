"""Weight-only int8 quantization of linear layers, written out: per output channel, symmetric.

For a weight W of shape (N, K) (N output channels, K inputs), each row n gets its own scale

    scale[n] = max_k |W[n, k]| / 127
    Q[n, k]  = clamp(round(W[n, k] / scale[n]), -127, 127)      (int8)
    W[n, k] ~= Q[n, k] * scale[n]

Activations stay in floating point; only the weights are stored (and read) as int8, so a matmul
reads a quarter of the fp32 bytes. Symmetric (no zero point) because trained weights are centred
on zero; -128 is left unused so that +-max map to +-127 exactly.

`Int8Linear.forward` runs y = x Q^T * scale + b through one of these kernels:
- "auto" (the default): "vnni" where the CPU has AVX-512 VNNI, for any number of rows (decoding,
  prompts, batches); else "c-fp32" for one or two rows where that kernel can run, and
  "int8pack-bf16" for more (prefill, larger batches).
- "vnni": handformer/inference/vnni_matvec.c, built with gcc at first use: each activation row
  rounded to int8 in blocks of 32 (a scale each, as llama.cpp's Q8_0), each int8 weight times
  int8 activation summed in integers by AVX-512 VNNI (vpdpbusd), scaled back in fp32; a quarter of
  fp32's bytes read at close to the machine's read bandwidth. It reads a copy of the weight laid
  out for it (`c_kernels.block_int8`: four rows interleaved 64 bytes at a time, made at the first
  call), in tiles of four outputs by up to four rows: a prompt of 64 rows runs 2.3x as fast as
  int8pack-bf16 on GPT-2-124M's layers, and a row's outputs are the same alone, in a batch or in a
  prompt. The activations' rounding (relative 2^-8 of each block's largest) is what it costs.
  Where it cannot run (no VNNI, no gcc, K not a multiple of 32, another dtype, inside
  torch.compile) the layer runs "c-fp32", then "int8pack-bf16".
- "int8pack-bf16": `torch.ops.aten._weight_int8pack_mm`, PyTorch's CPU kernel that reads the int8
  weights directly and applies the scales in the same pass, fed bf16 activations and scales (the
  dtype its vectorized AVX512 path serves); the result is cast back. It costs bf16 rounding of the
  activations and outputs (relative 2^-9), measured on trained models (README, "int8 weights"). Its
  vectorized loop has no tail: with K not a multiple of 16 torch 2.13 returns wrong numbers or
  crashes, so such layers take "dequant" instead.
- "int8pack-fp32": the same kernel with fp32 activations: exact, but torch 2.13 runs that dtype
  through a scalar loop, about 10x slower than fp32 `F.linear`.
- "dequant": Q * scale back to the activation dtype, then `F.linear`: exact, but it writes a float
  copy of the weight at every call (0.07x to 0.6x of fp32 speed); the fallback for other devices.
- "c-fp32": handformer/inference/c_kernels.py's int8 kernel, built with gcc at first use: the int8
  weights widened to fp32 in AVX-512 registers, fp32 activations and sums (no bf16 rounding); at one
  row 1.5x to 2.8x int8pack-bf16's speed here. Where it cannot be built or run (no AVX-512, no gcc,
  another dtype or device, K not a multiple of 16, inside torch.compile) the layer runs
  "int8pack-bf16".
benchmarks/int8_kernel.py measures them against fp32 on GPT-2-124M's layer shapes
(docs/benchmarks.md, "int8 matrix-vector products"). A run quantized with an explicit kernel name in
its config keeps it.

Shape legend: N output features, K input features, M rows of activations (batch x positions).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.inference import c_kernels
from handformer.replace import replace_layers

QMAX = 127  # symmetric int8 range: -127 .. 127
KERNELS = ("int8pack-bf16", "int8pack-fp32", "dequant", "c-fp32", "auto", "vnni")
BF16_K_MULTIPLE = 16  # _weight_int8pack_mm's bf16 path reads K in steps of 16, with no tail loop
DEFAULT_KERNEL = "auto"
TORCH_KERNEL = "int8pack-bf16"  # what "auto" and "c-fp32" run where the C kernel does not


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(N, K) float weight -> ((N, K) int8 values, (N,) float32 scales), per output channel."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)  # (N,)
    # An all-zero row would divide by zero; any positive scale quantizes it to zeros.
    scales = (amax / QMAX).clamp(min=torch.finfo(torch.float32).tiny)  # (N,)
    q = torch.round(w / scales[:, None]).clamp(-QMAX, QMAX).to(torch.int8)  # (N, K)
    return q, scales


def dequantize_int8(q: Tensor, scales: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """(N, K) int8 and (N,) scales -> the (N, K) weight they stand for, in `dtype`."""
    return (q.to(torch.float32) * scales[:, None]).to(dtype)


_HAS_INT8PACK = hasattr(torch.ops.aten, "_weight_int8pack_mm")  # looked up once: torch.ops lookups are slow


def int8pack_available(device: torch.device | str) -> bool:
    """Whether this torch has `_weight_int8pack_mm` for the device (CPU only here)."""
    return torch.device(device).type == "cpu" and _HAS_INT8PACK


class Int8Linear(nn.Module):
    """A drop-in `nn.Linear` whose weight is stored as int8 values and per-row float32 scales.

    State dict: `weight` (N, K) int8, `scales` (N,) float32, and `bias` (N,) when the layer has one.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 kernel: str = DEFAULT_KERNEL) -> None:
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"Int8Linear kernel is {kernel!r}; choose one of {', '.join(KERNELS)}")
        self.in_features, self.out_features, self.kernel = in_features, out_features, kernel
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self._scales_as: tuple[tuple[int, int, torch.dtype], Tensor] | None = None
        self._vnni: tuple[tuple, tuple, tuple[int | None, ...]] | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: str = DEFAULT_KERNEL) -> Int8Linear:
        """Quantize a trained `nn.Linear` (its bias is kept as it is, in floating point)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, kernel)
        q, scales = quantize_int8(linear.weight)
        layer.weight.copy_(q)
        layer.scales.copy_(scales)
        if linear.bias is not None:
            layer.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        return layer.to(linear.weight.device)

    def scales_as(self, dtype: torch.dtype) -> Tensor:
        """The scales in `dtype`, converted once and kept until the scales change (a decoding step
        calls every layer once: a conversion per call would cost as much as a small layer's product)."""
        key = (*c_kernels.stamp(self.scales), dtype)
        if self._scales_as is None or self._scales_as[0] != key:
            self._scales_as = (key, self.scales.to(dtype))
        return self._scales_as[1]

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., K) -> (..., N)."""
        kernel = self.kernel
        max_rows = None if kernel in ("c-fp32", "vnni") else c_kernels.MAX_ROWS
        if (kernel in ("vnni", "auto") and self.weight.is_cpu
                and c_kernels.usable("int8_vnni_linear", x, self.in_features, None)):  # any number of rows
            rows = x.reshape(-1, self.in_features).contiguous()  # (M, K)
            y = c_kernels.vnni_linear("int8_vnni_linear", rows, self.vnni_weights(), self.out_features)
            return y.view(*x.shape[:-1], self.out_features)  # (..., N)
        if kernel in ("c-fp32", "auto", "vnni"):
            if self.weight.is_cpu and c_kernels.usable("int8_linear", x, self.in_features, max_rows):
                return self._c_fp32(x)
            kernel = TORCH_KERNEL
        if kernel == "int8pack-bf16" and self.in_features % BF16_K_MULTIPLE:
            kernel = "dequant"
        if (kernel != "dequant" and _HAS_INT8PACK and x.is_cpu
                and x.dtype in (torch.float32, torch.bfloat16)):
            dtype = torch.bfloat16 if kernel == "int8pack-bf16" else x.dtype
            rows = x.reshape(-1, self.in_features).to(dtype).contiguous()  # (M, K)
            y = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scales_as(dtype))  # (M, N)
            if self.bias is not None and self.bias.dtype == x.dtype:
                y = y + self.bias  # one call: bf16 + fp32 promotes to fp32 exactly as a cast would
            else:
                y = y.to(x.dtype) if self.bias is None else y.to(x.dtype) + self.bias.to(x.dtype)
            return y.view(*x.shape[:-1], self.out_features)  # (..., N)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, dequantize_int8(self.weight, self.scales, x.dtype), bias)

    def vnni_weights(self) -> tuple[int | None, ...]:
        """The addresses the VNNI kernel reads (the weight as `c_kernels.block_int8` lays it out,
        scales, fp32 bias), kept while the layer holds the same tensor objects (scales and bias
        written in place stay where they are; a weight written in place is laid out again)."""
        return self._vnni_kept()[2]

    def vnni_blocked(self) -> Tensor:
        """The weight as int8_vnni_linear reads it (`c_kernels.block_int8`): a copy, made at the
        first call and again when the weight changes."""
        return self._vnni_kept()[1][0]

    def _vnni_kept(self) -> tuple[tuple, tuple, tuple[int | None, ...]]:
        tensors = (self._buffers["weight"], self._buffers["scales"], self._parameters.get("bias"))
        stamp = c_kernels.stamp(tensors[0])
        if (self._vnni is None or self._vnni[0][3:] != stamp
                or any(a is not b for a, b in zip(self._vnni[0], tensors))):
            weight, scales, bias = tensors
            kept = (c_kernels.block_int8(weight), scales.float().contiguous(),
                    None if bias is None else bias.detach().float().contiguous())
            self._vnni = ((*tensors, *stamp), kept, c_kernels.pointers(*kept))
        return self._vnni

    def _c_fp32(self, x: Tensor) -> Tensor:
        """x: (..., K) -> (..., N) through the C kernel (c_kernels.py; `c_kernels.usable` said yes)."""
        rows = x.reshape(-1, self.in_features).contiguous()  # (M, K)
        y = c_kernels.int8_linear(rows, self.weight.contiguous(), self.scales.contiguous())  # (M, N)
        y = y if self.bias is None else y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)  # (..., N)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, kernel={self.kernel!r}")


def quantize_linears(model: nn.Module, skip: Iterable[str] = (), kernel: str = DEFAULT_KERNEL,
                     empty: bool = False, bits: int = 8, group_size: int = 32) -> list[str]:
    """Replace every `nn.Linear` in `model` (in place) by an `Int8Linear` (bits=8) or an
    `Int4Linear` in groups of `group_size` inputs (bits=4; a layer whose input width is not a
    multiple of the group size gets int8 instead), except the modules named in `skip` (e.g.
    "lm_head"). `empty=True` builds zero layers of the right shapes, for loading saved weights into.
    Returns the names of the replaced modules.

    A linear layer whose weight is tied to an embedding (a tied output head) gets its own quantized
    copy; the embedding lookup keeps the floating-point table."""
    from handformer.inference.quant_int4 import Int4Linear, check_group_size

    if bits not in (4, 8):
        raise ValueError(f"bits is {bits!r}; handformer quantizes weights to 8 or 4 bits")
    if bits == 4:
        check_group_size(group_size)
    skip = set(skip)
    targets = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear) and name not in skip}

    def build(linear: nn.Linear) -> nn.Module:
        has_bias = linear.bias is not None
        if bits == 4 and linear.in_features % group_size == 0:
            layer = (Int4Linear(linear.in_features, linear.out_features, has_bias, group_size) if empty
                     else Int4Linear.from_linear(linear, group_size))
        else:
            layer = (Int8Linear(linear.in_features, linear.out_features, has_bias, kernel) if empty
                     else Int8Linear.from_linear(linear, kernel))
        return layer.to(linear.weight.device)

    return replace_layers(model, targets, build)


def set_kernel(model: nn.Module, kernel: str) -> None:
    """Switch every `Int8Linear` in `model` to `kernel` (one of KERNELS)."""
    if kernel not in KERNELS:
        raise ValueError(f"int8 kernel is {kernel!r}; choose one of {', '.join(KERNELS)}")
    for m in model.modules():
        if isinstance(m, Int8Linear):
            m.kernel = kernel


__all__ = ["DEFAULT_KERNEL", "Int8Linear", "KERNELS", "TORCH_KERNEL", "dequantize_int8", "int8pack_available",
           "quantize_int8", "quantize_linears", "set_kernel"]
