"""Scaled dot-product attention and multi-head attention (section 3.2 of the paper).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

`attention` is that formula, line by line. `scaled_dot_product_attention` is the one attention
function every layer calls: it runs torch's fused kernel (`F.scaled_dot_product_attention`, the
same result without building the (T, S) scores), and `attention` when the weights are asked for;
a test pins that the two agree.

Masks follow `handformer.nn.masks`: boolean (or the tutorials' 0/1), True = may attend.

Shape legend: B batch, T query length, S key length, D d_model, H query heads, Hkv key/value heads,
Dh head dim (d_k; usually D / H, but a model may choose it freely, as Gemma does).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.nn.kv_cache import NO_CACHE, LayerCache, as_cache
from handformer.nn.masks import AttentionMask, as_attention_mask
from handformer.nn.norms import make_norm
from handformer.nn.positions import apply_rotary


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
              dropout_p: float = 0.0, sinks: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d_k)) v for (B, H, T, Dh) queries and (B, H, S, Dh) keys and values,
    step by step. mask: bool, broadcasts to (B, H, T, S), True = may attend. sinks: (H,) logits
    that join each head's softmax as a key whose value is zero (gpt-oss's attention sinks).
    Returns (out (B, H, T, Dh), weights (B, H, T, S)): each row of weights sums to 1 (less what the
    sink took)."""
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # a hidden key gets weight exactly 0
    if sinks is not None:  # one more column, the sink's, dropped after the softmax
        sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)  # (B, H, T, 1)
        scores = torch.cat([scores, sink], dim=-1)  # (B, H, T, S + 1)
    wide = torch.promote_types(scores.dtype, torch.float32)  # float32 at least: a float64 model keeps float64
    weights = torch.softmax(scores, dim=-1, dtype=wide).to(q.dtype)  # (B, H, T, S[+1])
    weights = weights[..., :k.size(-2)]  # (B, H, T, S): without the sink's column
    out = F.dropout(weights, p=dropout_p, training=dropout_p > 0) @ v  # (B, H, T, Dh)
    return out, weights


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Grouped-query attention: share each key/value head with `n_rep` consecutive query heads."""
    B, Hkv, S, Dh = x.shape
    x = x[:, :, None, :, :].expand(B, Hkv, n_rep, S, Dh)  # (B, Hkv, n_rep, S, Dh)
    return x.reshape(B, Hkv * n_rep, S, Dh)  # (B, H, S, Dh)


def _fused_sharing_kv_heads(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask,
                            dropout_p: float) -> Tensor:
    """The fused kernel, which shares each key/value head with its query heads itself (torch >= 2.5:
    no copies of K and V, no sum over them in backward)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.allowed, dropout_p=dropout_p,
                                          is_causal=mask.is_causal, enable_gqa=k.size(1) != q.size(1))


def _fused_repeating_kv_heads(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask,
                              dropout_p: float) -> Tensor:
    """The fused kernel of torch 2.4, with the key/value heads repeated first."""
    n_rep = q.size(1) // k.size(1)
    return F.scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask=mask.allowed,
                                          dropout_p=dropout_p, is_causal=mask.is_causal)


SDPA_SHARES_KV_HEADS = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)
fused_attention = _fused_sharing_kv_heads if SDPA_SHARES_KV_HEADS else _fused_repeating_kv_heads


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor,
                                 mask: AttentionMask | Tensor | None = None, *, need_weights: bool = False,
                                 dropout_p: float = 0.0, sinks: Tensor | None = None,
                                 ) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(Dh)) v over (B, H, T, Dh) queries and (B, Hkv, S, Dh) keys/values.

    mask: an `AttentionMask`, or a bool / 0-1 tensor broadcasting to (B, H, T, S), True = may
    attend. A query row whose keys are all hidden gives zeros (and zero weights), never NaN.
    sinks: (H,) attention sinks (see `attention`); no fused kernel takes them, so the formula runs.
    Returns (out (B, H, T, Dh), weights (B, H, T, S) where the formula ran (need_weights or sinks),
    else None).
    """
    mask = as_attention_mask(mask)  # a model hands over its own, built once per forward
    if mask.is_causal and q.size(-2) != k.size(-2):
        raise ValueError("is_causal=True needs equal query and key lengths (nothing cached); pass an "
                         "explicit causal mask (handformer.nn.masks.causal_mask) instead")
    if need_weights or sinks is not None:  # the formula, step by step
        n_rep = q.size(1) // k.size(1)
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, Dh)
        out, weights = attention(q, k, v, mask.dense(q.size(-2), k.size(-2), q.device), dropout_p, sinks)
        return mask.zero_empty_rows(out), mask.zero_empty_rows(weights)
    out = fused_attention(q, k, v, mask, dropout_p)  # (B, H, T, Dh)
    return mask.zero_empty_rows(out), None


class MultiHeadAttention(nn.Module):
    """Multi-head attention: project to Q, K, V, split into heads, attend, concat, apply W_O.

    Self-attention by default (queries, keys and values all from one input); cross-attention when
    keys and values come from another (the encoder output, in the decoder). `n_kv_heads < n_heads`
    gives grouped-query attention. With bias=True and n_kv_heads == n_heads it has 4 * D^2 weights
    + 4 * D biases. `qk_norm` normalizes each query and key head before RoPE (Qwen3, Gemma 3),
    which keeps the scores from growing with the weights.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                 bias: bool = True, dropout: float = 0.0, *, head_dim: int | None = None,
                 qkv_bias: bool = False, qk_norm: str = "none", norm_eps: float = 1e-6) -> None:
        """bias: biases on every projection. head_dim: width of each head, d_model // n_heads by
        default (Gemma sets it wider). qkv_bias: biases on W_Q, W_K, W_V even when bias=False
        (Qwen2 has only these). qk_norm: the norm of each query and key head ("rmsnorm" in Qwen3,
        "rmsnorm_offset" in Gemma 3; "none": no norm), with epsilon norm_eps."""
        super().__init__()
        if head_dim is None and d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads} (or give head_dim)")
        if n_kv_heads is not None and n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads}")
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        self.head_dim = head_dim or d_model // n_heads  # d_k
        self.dropout = dropout
        qkv_bias = bias or qkv_bias
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=qkv_bias)  # W_Q
        self.k_proj = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=qkv_bias)  # W_K
        self.v_proj = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=qkv_bias)  # W_V
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)  # W_O
        self.q_norm = make_norm(qk_norm, self.head_dim, norm_eps)  # NoNorm for "none"
        self.k_norm = make_norm(qk_norm, self.head_dim, norm_eps)

    def split_heads(self, x: Tensor, n_heads: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n_heads, self.head_dim).transpose(1, 2)  # (B, n_heads, T, Dh)

    def project(self, query: Tensor, key: Tensor, value: Tensor, rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerCache = NO_CACHE) -> tuple[Tensor, Tensor, Tensor]:
        """Q = query W_Q, K = key W_K, V = value W_V, each split into heads: (B, H, T, Dh) and
        (B, Hkv, S, Dh) twice; with q/k norms, each head normalized; with RoPE, queries and keys
        turned by their positions' angles. In cross-attention while decoding, the memory's keys and
        values are projected at the first step only: the cache hands them out afterwards."""
        q = self.q_norm(self.split_heads(self.q_proj(query), self.n_heads))  # (B, H, T, Dh)
        if cache.memory_kv is not None:  # cross-attention, decoding: projected at the first step
            return q, *cache.memory_kv  # (B, Hkv, S, Dh) twice
        k = self.k_norm(self.split_heads(self.k_proj(key), self.n_kv_heads))  # (B, Hkv, S, Dh)
        v = self.split_heads(self.v_proj(value), self.n_kv_heads)  # (B, Hkv, S, Dh)
        if rope is not None:  # rotary positions (self-attention)
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        return q, k, v

    def forward(self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None,
                mask: AttentionMask | Tensor | None = None, *, need_weights: bool = False,
                rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerCache | None = None) -> tuple[Tensor, Tensor | None]:
        """query (B, T, D); key and value (B, S, D), the query by default: `mha(x)` is
        self-attention, `mha(x, memory)` cross-attention, `mha(q, k, v, mask)` the tutorial's call.
        mask: see `scaled_dot_product_attention`. rope: (cos, sin), (B|1, 1, T, Dh) each, rotates
        queries and keys by their positions (RoPE). cache: this layer's KV cache, which hands out
        the keys and values of earlier positions too.
        Returns (output (B, T, D), weights (B, H, T, S) if need_weights else None)."""
        check_not_a_mask(key, value)
        key = query if key is None else key  # self-attention, unless keys come from elsewhere
        value = key if value is None else value
        cache = as_cache(cache)  # None: no KV cache, the new positions are all there is
        B, T, _ = query.shape
        q, k, v = self.project(query, key, value, rope, cache)  # (B, H, T, Dh), (B, Hkv, S, Dh) twice
        k, v = cache.update(k, v)  # with a KV cache (decoding): every position so far, (B, Hkv, S, Dh)
        out, weights = self.attend(q, k, v, mask, need_weights)  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, H * Dh): concat
        return self.o_proj(out), weights

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | Tensor | None,
               need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """softmax(q k^T / sqrt(Dh)) v, the one attention function (a family that scores otherwise,
        Gemma's soft-capping, replaces this method: handformer.families)."""
        return scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights,
                                            dropout_p=self.dropout * self.training)


def check_not_a_mask(key: Tensor | None, value: Tensor | None) -> None:
    """A bool or integer tensor where a key or value belongs is a mask passed in an older call's
    order, mha(x, context, mask): a TypeError that shows the call to write."""
    for name, given in (("key", key), ("value", value)):
        if given is not None and not given.is_floating_point():
            raise TypeError(f"MultiHeadAttention got a {given.dtype} tensor as its {name}: pass the mask by "
                            f"name, mha(x, mask=mask), or as the 4th argument, mha(q, k, v, mask)")
