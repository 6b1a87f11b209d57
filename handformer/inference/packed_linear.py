"""Linear layers whose weights are packed once for oneDNN: faster inference on a CPU.

`F.linear` on a CPU hands its matrix product to MKL. In decoding, the products are thin (one row, or
a few dozen, against a weight of millions of numbers), so their speed is how fast the weight streams
from memory. On this project's machine (2-core AMD EPYC with AVX-512, torch 2.13) MKL streamed a
GPT-2-sized weight at 14 GB/s, whatever the thread count, while a plain read of memory runs at 23 GB/s
(one thread) to 31 GB/s (two). oneDNN (the library behind `torch.backends.mkldnn`), given the weight
reordered once into the blocked layout its kernels read best, streamed the same weights at about
25 GB/s with two threads: 1.6x to 2x `F.linear` for 1 to 32 rows (`benchmarks/packed_linear.py`).

`PackedLinear` is that, as a drop-in for an `nn.Linear`:

    packed = torch.ops.mkldnn._reorder_linear_weight(W, batch_hint)     (once, when packing)
    y      = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")   ( = x W^T + b)

bf16 weights (runs written by `handformer quantize --bf16`) are packed the same way: on the same
machine, which has native bf16 instructions (AVX512-BF16), they ran at 2x the packed fp32 speed and
1.4x bf16 `F.linear`.

One or two rows of fp32 activations (decoding at batch 1 or 2) go to a C kernel instead
(handformer/inference/c_kernels.py, f32_matvec.c, built by gcc at first use), which reads its own
copy of the weight, four rows interleaved into one stream, in 2 MiB pages where Linux gives them
(c_kernels.huge_page_empty), with AVX-512 FMAs: on the same machine,
at one thread, it streamed GPT-2-124M's weights 1.65x as fast as the packed layers at one row, while
at eight rows oneDNN's packed kernel is faster (docs/benchmarks.md). The layer then holds the weight
twice (packed, and blocked for the C kernel): twice the weights' memory for the speed of batch-1
decoding.
Where the C kernel cannot run (no AVX-512, no gcc, HANDFORMER_NO_C_KERNELS=1, bf16 weights, an input
width that is not a multiple of 16) the layer keeps the packed weight alone and runs it for every
row count.

The result equals `F.linear` up to the order of the sums (differences of about 1e-6 relative, as
between two thread counts). Beside the packed weight the layer keeps no copy but the C kernel's; its
state dict still holds a plain `weight`, unpacked exactly (x = I gives W^T: each output is one product by 1
plus zeros). It is for inference only: in training mode it raises (pack after training, or call
`unpack_linears` first).

Small matrices are left alone: below about 1 MiB oneDNN's fixed cost per call (~15 us against
~3 us for `F.linear` at 64 x 64) is larger than what it saves, which matters for tiny models whose
time is all per-operation overhead.

Shape legend: N output features, K input features, M rows (batch x positions).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from handformer.inference import c_kernels
from handformer.replace import replace_layers

MIN_PACKED_BYTES = 1 << 20  # pack weights of at least 1 MiB (fp32: 262,144 numbers)
PACKED_DTYPES = (torch.float32, torch.bfloat16)


def packing_available(device: torch.device | str = "cpu") -> bool:
    """Whether this torch can pack linear weights for oneDNN on `device` (x86 CPU builds can)."""
    return (torch.device(device).type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _reorder(weight: Tensor, batch_hint: int | None) -> Tensor:
    """The weight in oneDNN's packed layout; a CPU whose oneDNN cannot pack this dtype (bf16 without
    AVX512-BF16, AVX-512 BW/VL/DQ or AVX-NE-CONVERT) gets a ValueError that says what to do."""
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
    except RuntimeError as err:
        raise ValueError(f"this CPU's oneDNN cannot pack {weight.dtype} weights ({str(err).strip()}); "
                         "leave the layer an nn.Linear (pack_linears does so by itself) or use fp32 "
                         "weights") from None


class PackedLinear(nn.Module):
    """An `nn.Linear` for inference whose (N, K) fp32 or bf16 weight is stored in oneDNN's packed
    layout. `from_linear(linear)` packs a trained layer; `to_linear()` gives the plain layer back
    exactly. Inputs of another dtype are computed in the weight's dtype and cast back.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None, batch_hint: int | None = None,
                 one_row: bool = True) -> None:
        super().__init__()
        if weight.dtype not in PACKED_DTYPES or weight.device.type != "cpu":
            raise ValueError(f"PackedLinear packs fp32 or bf16 CPU weights, got {weight.dtype} on "
                             f"{weight.device}")
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self.batch_hint = batch_hint
        # An opaque oneDNN tensor, not a buffer: `.to()`/`.float()` must not touch it; the state
        # dict gets a plain `weight` instead (see _save_to_state_dict).
        self.packed = _reorder(weight.detach().contiguous(), batch_hint)
        if bias is None:
            self.bias = None
        else:
            self.register_buffer("bias", bias.detach().to(weight.dtype).clone())
        # the copy the one-row C kernel reads (not saved: the state dict's `weight` is enough)
        self.one_row = (one_row and self.dtype == torch.float32
                        and self.in_features % c_kernels.K_MULTIPLE == 0)
        self.register_buffer("blocked", self._blocked_copy(weight), persistent=False)

    def _blocked_copy(self, weight: Tensor) -> Tensor | None:
        """`weight` in the C kernel's layout (c_kernels.block_rows), or None where it cannot run."""
        if not self.one_row or c_kernels.kernel("f32_linear") is None:
            return None
        return c_kernels.block_rows(weight.to(torch.float32))

    @classmethod
    def from_linear(cls, linear: nn.Linear, batch_hint: int | None = None) -> PackedLinear:
        return cls(linear.weight, linear.bias, batch_hint).train(linear.training)

    @property
    def weight(self) -> Tensor:
        """The (N, K) weight, unpacked: I (K, K) @ W^T is W^T exactly."""
        if self.blocked is not None:
            return c_kernels.unblock_rows(self.blocked, self.out_features)
        eye = torch.eye(self.in_features, dtype=self.dtype)  # (K, K)
        with torch.no_grad():
            return torch.ops.mkldnn._linear_pointwise(eye, self.packed, None, "none", [], "").t().contiguous()

    def to_linear(self) -> nn.Linear:
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           dtype=self.dtype).train(self.training)
        with torch.no_grad():
            linear.weight.copy_(self.weight)
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., K) -> (..., N)."""
        if self.training:
            raise RuntimeError("this layer's weight is packed for inference "
                               "(handformer.inference.packed_linear); call model.eval(), or "
                               "unpack_linears(model) before training")
        if x.dtype != self.dtype:
            return self.forward(x.to(self.dtype)).to(x.dtype)
        if self.blocked is not None and c_kernels.usable("f32_linear", x, self.in_features):
            rows = x.reshape(-1, self.in_features).contiguous()  # (M, K), M <= c_kernels.MAX_ROWS
            y = c_kernels.f32_linear(rows, self.blocked, self.out_features, self.bias)  # (M, N)
            return y.view(*x.shape[:-1], self.out_features)  # (..., N)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")  # (..., N)

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # noqa: ANN001
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.weight

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,  # noqa: ANN001
                              unexpected_keys, error_msgs):
        weight = state_dict.get(prefix + "weight")
        if weight is not None:
            if tuple(weight.shape) != (self.out_features, self.in_features):
                error_msgs.append(f"size mismatch for {prefix}weight: copying a param with shape "
                                  f"{tuple(weight.shape)}, the packed layer has "
                                  f"{(self.out_features, self.in_features)}")
            else:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(
                    weight.to(self.dtype).contiguous(), self.batch_hint)
                self.blocked = self._blocked_copy(weight)
        elif strict:
            missing_keys.append(prefix + "weight")
        rest = {k: v for k, v in state_dict.items() if k != prefix + "weight"}
        super()._load_from_state_dict(rest, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, batch_hint={self.batch_hint}")


_WORKS: dict[torch.dtype, bool] = {}


def packs_dtype(dtype: torch.dtype) -> bool:
    """Whether this machine's oneDNN packs and multiplies `dtype` weights: tried once on an 8 x 8
    layer (a CPU without bf16 support, or a non-x86 build, raises there instead of mid-generation)."""
    if dtype not in _WORKS:
        try:
            layer = PackedLinear(torch.eye(8, dtype=dtype), None).eval()
            _WORKS[dtype] = bool(torch.equal(layer(torch.eye(8, dtype=dtype)), torch.eye(8, dtype=dtype)))
        except (RuntimeError, ValueError):
            _WORKS[dtype] = False
    return _WORKS[dtype]


def pack_linears(model: nn.Module, min_bytes: int = MIN_PACKED_BYTES, batch_hint: int | None = None,
                 skip: Iterable[str] = ()) -> list[str]:
    """Replace (in place) every fp32 or bf16 CPU `nn.Linear` of `model` whose weight has `min_bytes`
    by a `PackedLinear`, except the modules named in `skip`. Does nothing where packing is not
    available (`packing_available`), and leaves a dtype alone that oneDNN cannot run here
    (`packs_dtype`). A head tied to the embedding gets its own packed copy; the
    embedding keeps its table. Returns the names of the packed layers. (bf16 weights without native
    bf16 instructions run through oneDNN's emulation; `handformer quantize --bf16` says so.)

    batch_hint: the rows per call oneDNN lays the weight out for (None: its general layout; measured
    within a few percent of the best at 1, 8 and 32 rows with two threads)."""
    if not packing_available():
        return []
    skip = set(skip)
    targets = {name: m for name, m in model.named_modules()
               if type(m) is nn.Linear and name not in skip and m.weight.dtype in PACKED_DTYPES
               and m.weight.device.type == "cpu" and m.weight.numel() * m.weight.element_size() >= min_bytes
               and packs_dtype(m.weight.dtype)}
    return replace_layers(model, targets, lambda linear: PackedLinear.from_linear(linear, batch_hint))


def unpack_linears(model: nn.Module) -> list[str]:
    """Undo `pack_linears`: every `PackedLinear` back to an exact `nn.Linear`. Returns their names."""
    targets = {name: m for name, m in model.named_modules() if isinstance(m, PackedLinear)}
    return replace_layers(model, targets, PackedLinear.to_linear)


__all__ = ["MIN_PACKED_BYTES", "PACKED_DTYPES", "PackedLinear", "pack_linears", "packing_available",
           "packs_dtype", "unpack_linears"]
