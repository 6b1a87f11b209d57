"""The reference computations of each component, written as plain functions, with every mistake of
`handformer.check.diagnoses` available as a flag.

With no flags each function computes what handformer's own module computes (tests pin it); with a
flag it computes what a learner's code with that mistake computes, from the same weights. A flag is
"name" or "name:form", e.g. "softmax_wrong_dim:-2" or "no_residual:ffn". Masks are bool, True = may
attend, and are applied as the tutorials do (`masked_fill(-1e9)`), so a query with no visible key
gets uniform weights here, as in the learner's code.

Shape legend: B batch, T query length, S key length, D d_model, H heads, Dh head dim, F FFN width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

Linear = tuple[Tensor, Tensor | None]  # (weight (out, in), bias (out,) or None)
Flags = frozenset[str]

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def has(flags: Flags, name: str) -> str | None:
    """The form of flag `name` in `flags` ("" for a flag without a form), or None."""
    for flag in flags:
        head, _, form = flag.partition(":")
        if head == name:
            return form
    return None


def linear(x: Tensor, w: Linear) -> Tensor:
    return F.linear(x, w[0], w[1])


def applied_keep(keep: Tensor | None, flags: Flags) -> Tensor | None:
    """The mask as the attention with these mistakes applies it (True = may attend)."""
    if keep is not None and has(flags, "mask_inverted") is not None:
        return ~keep
    return keep


def attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, flags: Flags = frozenset(),
              ) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(Dh)) v for (B, H, T, Dh) queries; returns (out (B, H, T, Dh), weights)."""
    scores = q @ k.transpose(-2, -1)  # (B, H, T, S)
    if has(flags, "no_scaling") is None:
        dk = q.size(-1)
        scores = scores / (dk if has(flags, "scale_by_dk") is not None else math.sqrt(dk))
    keep = applied_keep(keep, flags)
    after = has(flags, "mask_after_softmax")
    if keep is not None and after is None:
        scores = scores.masked_fill(~keep, -1e9)
    dim = has(flags, "softmax_wrong_dim")
    weights = torch.softmax(scores, dim=int(dim) if dim else -1)
    if keep is not None and after is not None:
        weights = weights.masked_fill(~keep, 0.0 if after == "zero" else -1e9)
    return weights @ v, weights  # (B, H, T, Dh)


@dataclass
class MHAWeights:
    q: Linear
    k: Linear
    v: Linear
    o: Linear | None  # None: the learner's module has no output projection
    n_heads: int


def split_heads(x: Tensor, n_heads: int, flags: Flags) -> Tensor:
    B, T, D = x.shape
    if has(flags, "split_no_transpose") is not None:
        return x.view(B, n_heads, T, D // n_heads)  # (B, H, T, Dh) with positions mixed
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, H, T, Dh)


def multi_head_attention(w: MHAWeights, xq: Tensor, xk: Tensor, xv: Tensor, keep: Tensor | None,
                         flags: Flags = frozenset()) -> tuple[Tensor, Tensor]:
    """(B, T, D) queries, (B, S, D) keys and values -> ((B, T, D), weights (B, H, T, S))."""
    B, T, D = xq.shape
    wk, wv = (w.v, w.k) if has(flags, "kv_swapped") is not None else (w.k, w.v)
    q = split_heads(linear(xq, w.q), w.n_heads, flags)  # (B, H, T, Dh)
    k = split_heads(linear(xk, wk), w.n_heads, flags)  # (B, H, S, Dh)
    v = split_heads(linear(xv, wv), w.n_heads, flags)  # (B, H, S, Dh)
    out, weights = attention(q, k, v, keep, flags)  # (B, H, T, Dh)
    if has(flags, "concat_no_transpose") is not None:
        out = out.contiguous().view(B, T, D)  # (B, T, D) from the raw (B, H, T, Dh) memory
    else:
        out = out.transpose(1, 2).contiguous().view(B, T, D)  # (B, T, D)
    if w.o is not None and has(flags, "no_output_projection") is None:
        out = linear(out, w.o)
    return out, weights


@dataclass
class FFNWeights:
    up: Linear
    down: Linear
    gate: Linear | None = None
    activation: str = "relu"


def feed_forward(w: FFNWeights, x: Tensor, flags: Flags = frozenset()) -> Tensor:
    """down(act(up(x))), or down(act(gate(x)) * up(x)) when gated; (B, T, D) -> (B, T, D)."""
    act = (lambda h: h) if has(flags, "ffn_no_activation") is not None else ACTIVATIONS[w.activation]
    if w.gate is not None:
        return linear(act(linear(x, w.gate)) * linear(x, w.up), w.down)
    return linear(act(linear(x, w.up)), w.down)


@dataclass
class NormWeights:
    weight: Tensor
    bias: Tensor | None
    eps: float
    kind: str = "layernorm"  # layernorm | rmsnorm | layernorm_unbiased_std (a mistake)


def norm(w: NormWeights, x: Tensor) -> Tensor:
    if w.kind == "rmsnorm":
        return w.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + w.eps))
    if w.kind == "layernorm_unbiased_std":  # the Annotated Transformer's: (x - mean) / (std + eps)
        bias = w.bias if w.bias is not None else 0.0
        return w.weight * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + w.eps) + bias
    return F.layer_norm(x, (x.size(-1),), w.weight, w.bias, w.eps)


@dataclass
class LayerWeights:
    """An encoder layer, decoder layer or decoder-only block: attentions, FFN, one norm a sublayer."""

    self_attn: MHAWeights
    ffn: FFNWeights
    norms: list[NormWeights]  # in sublayer order: self-attention, (cross-attention,) FFN
    cross_attn: MHAWeights | None = None
    placement: str = "post"  # the placement every sublayer uses unless a pre_norm flag flips one
    sublayers: list[str] = field(default_factory=lambda: ["attn", "ffn"])


def sublayer(w: LayerWeights, x: Tensor, f: Callable[[Tensor], Tensor], name: str, flags: Flags,
             ) -> Tensor:
    """post: norm(x + f(x)); pre: x + f(norm(x)); no_residual drops the `x +`."""
    n = w.norms[w.sublayers.index(name)]
    pre = (w.placement == "pre") != (has(flags, "pre_norm") == name)
    residual = has(flags, "no_residual") != name
    if pre:
        h = f(norm(n, x))
        return x + h if residual else h
    h = f(x)
    return norm(n, x + h if residual else h)


def encoder_layer(w: LayerWeights, x: Tensor, keep: Tensor | None, flags: Flags = frozenset(),
                  ) -> Tensor:
    """The encoder layer and the decoder-only block: self-attention, then FFN; (B, T, D)."""
    x = sublayer(w, x, lambda h: multi_head_attention(w.self_attn, h, h, h, keep, flags)[0], "attn",
                 flags)
    return sublayer(w, x, lambda h: feed_forward(w.ffn, h, flags), "ffn", flags)


def decoder_layer(w: LayerWeights, x: Tensor, memory: Tensor, src_keep: Tensor | None,
                  tgt_keep: Tensor | None, flags: Flags = frozenset()) -> Tensor:
    """Masked self-attention, cross-attention over `memory` (B, S, D), FFN; (B, T, D)."""
    assert w.cross_attn is not None
    if has(flags, "decoder_masks_swapped") is not None:
        src_keep, tgt_keep = tgt_keep, src_keep
    x = sublayer(w, x, lambda h: multi_head_attention(w.self_attn, h, h, h, tgt_keep, flags)[0],
                 "attn", flags)
    x = sublayer(w, x, lambda h: multi_head_attention(w.cross_attn, h, memory, memory, src_keep,
                                                      flags)[0], "cross", flags)
    return sublayer(w, x, lambda h: feed_forward(w.ffn, h, flags), "ffn", flags)


def causal_keep(T: int, flags: Flags = frozenset(), device: torch.device | None = None) -> Tensor:
    """(T, T) bool, True where query t may see key s: s <= t; off by one on request."""
    form = has(flags, "causal_off_by_one")
    diagonal = {"no_self": -1, "sees_next": 1}.get(form or "", 0)
    return torch.ones(T, T, dtype=torch.bool, device=device).tril(diagonal)


def sinusoidal(T: int, D: int, flags: Flags = frozenset(), dtype: torch.dtype = torch.float64,
               ) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/D)), PE[pos, 2i+1] = cos(...); (T, D). Flags give the
    classic wrong versions."""
    pos = torch.arange(T, dtype=dtype)[:, None]  # (T, 1)
    pair = torch.arange(0, D, 2, dtype=dtype)  # (D/2,): 2i
    form = has(flags, "pe_wrong_frequency")
    table = torch.zeros(T, D, dtype=dtype)
    if form == "dim_index":  # column j uses 10000^(j/D), not the pair's 2i
        angle = pos / 10000 ** (torch.arange(D, dtype=dtype) / D)  # (T, D)
        even, odd = angle[:, 0::2], angle[:, 1::2]
    else:
        exponent = {"pair_index": pair / 2 / D, "positive": -pair / D}.get(form or "", pair / D)
        even = odd = pos / 10000 ** exponent  # (T, D/2)
    sin, cos = (torch.cos, torch.sin) if has(flags, "pe_sin_cos_swapped") is not None else (
        torch.sin, torch.cos)
    table[:, 0::2] = sin(even)
    table[:, 1::2] = cos(odd)
    return table
