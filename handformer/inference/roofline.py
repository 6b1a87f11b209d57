"""The memory-bandwidth bound of decoding and how close a run gets to it (MBU), as every decode
benchmark reports them.

At batch 1 every new token reads every weight once: a step cannot be faster than the time to
stream those bytes from memory. So:

    read bandwidth  = best of 5 `x.sum()` over a 1 GiB fp32 tensor, at the decode's thread count
    bytes per token = every weight as stored, once (a tied head once; a lookup table that is not
                      the head, one row: that is what a step reads), plus the KV cache at the
                      mean length it has while decoding
    bound           = read bandwidth / bytes per token              (tokens/s)
    MBU             = achieved tokens/s / bound                     (memory-bandwidth utilisation)

MBU means something only when the weights exceed the last-level cache (GPT-2-124M's 0.5 GB do;
a model of a few MB is served from the cache, where the bound means little).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from handformer.inference.packed_linear import PackedLinear
from handformer.inference.quant_int4 import Int4Linear
from handformer.inference.threads import intra_op_threads

GIB = 2**30
QUANTIZED_BUFFERS = ("lm_head.weight", "proj.weight", "scales")  # Int8Linear's (Int4Linear: int4_bytes)


def int4_bytes(layer: Int4Linear) -> int:
    """Bytes an Int4Linear's kernel reads a step: the nibbles plus, a group of inputs, a float16
    scale (2 bytes: the Q4_0 form, zeros 0, as the VNNI kernel and a Q4_0 file hold it) or, where the
    zeros are not all 0, a bf16 scale and zero (4 bytes: torch's kernel). The stored float32 scales
    and zeros are not what a step reads."""
    per_group = 2 if not layer.zeros.any() else 4
    return layer.weight.numel() * layer.weight.element_size() + layer.scales.numel() * per_group


def read_bandwidth(threads: int | None = None, size: int = GIB, repeats: int = 5) -> float:
    """Bytes/s: the best of `repeats` streaming reads (a sum: every byte read once, nothing written)
    of a `size`-byte fp32 tensor, at `threads` intra-op threads (None: torch's setting)."""
    data = torch.ones(size // 4)
    best = float("inf")
    with intra_op_threads(threads):
        data.sum()  # first touch
        for _ in range(repeats):
            start = time.perf_counter()
            data.sum()
            best = min(best, time.perf_counter() - start)
    return size / best


def bytes_per_token(model: nn.Module, kv_length: float) -> float:
    """Bytes one decoding step of `model` (a CausalLM, plain, packed or quantized) reads: every
    weight as stored, once, the lookup tables (token and learned-position embeddings) one row each
    unless the token table is also the head, plus the K and V cache of `kv_length` positions in the
    activations' dtype. Rotary cos/sin rows are a few hundred bytes: not counted."""
    cfg = model.cfg
    head = model.lm_head.weight if type(model.lm_head) is nn.Linear else None  # a packed head: its own copy
    lookups = {id(model.embed.weight)} | {id(p) for p in model.positions.parameters()}
    int4 = [m for m in model.modules() if isinstance(m, Int4Linear)]
    skipped = {id(t) for m in int4 for t in (m.weight, m.scales, m.zeros)}  # counted by int4_bytes
    buffers = [b for name, b in model.named_buffers()
               if name.endswith(QUANTIZED_BUFFERS) and id(b) not in skipped]
    stored = list(model.parameters()) + buffers
    total, seen = float(sum(int4_bytes(m) for m in int4)), set()
    for t in stored:
        if id(t) not in seen:
            seen.add(id(t))
            table_row = id(t) in lookups and t is not head
            total += t.shape[1] * t.element_size() if table_row else t.numel() * t.element_size()
    for m in model.modules():  # packed weights are no parameters: counted by their layer's shape
        if isinstance(m, PackedLinear):
            total += m.in_features * m.out_features * torch.empty((), dtype=m.dtype).element_size()
            total += 0 if m.bias is None else m.bias.numel() * m.bias.element_size()
    cache_bytes = model.embed.weight.element_size()  # the activations' dtype: fp32, or bf16 for bf16 runs
    return total + 2 * cfg.n_layers * cfg.kv_heads * cfg.head_dim * cache_bytes * kv_length


def bound(bandwidth: float, model: nn.Module, kv_length: float) -> float:
    """Tokens/s a batch-1 decoding step of `model` cannot pass at `bandwidth` bytes/s."""
    return bandwidth / bytes_per_token(model, kv_length)


def roofline_line(tokens_per_s: float, bound_tokens_per_s: float) -> str:
    """'28.1 tokens/s, bound 35.2 tokens/s, MBU 0.80': what every decode benchmark prints."""
    return (f"{tokens_per_s:.1f} tokens/s, bound {bound_tokens_per_s:.1f} tokens/s, "
            f"MBU {tokens_per_s / bound_tokens_per_s:.2f}")


__all__ = ["bound", "bytes_per_token", "int4_bytes", "read_bandwidth", "roofline_line"]
