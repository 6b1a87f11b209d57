"""Scaled dot-product attention and multi-head attention (section 3.2 of the paper).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

`scaled_dot_product_attention` is the one attention function of handformer. It has two paths that
compute the same thing (a test pins it): a fast path through `torch.nn.functional.
scaled_dot_product_attention` (fused kernels) and an explicit path, written as the formula above,
used when the caller asks for the attention weights.

Masks follow `handformer.nn.masks`: boolean, True = may attend.

Shape legend: B batch, T query length, S key length, D d_model, H query heads, Hkv key/value heads,
Dh head dim (d_k; usually D / H, but a model may choose it freely, as Gemma does).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.nn.kv_cache import LayerKVCache
from handformer.nn.positions import apply_rotary

# torch >= 2.5: the fused kernel shares each key/value head with its group of query heads itself.
SDPA_SHARES_KV_HEADS = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """Grouped-query attention: share each key/value head with `n_rep` consecutive query heads."""
    if n_rep == 1:
        return x
    B, Hkv, S, Dh = x.shape
    x = x[:, :, None, :, :].expand(B, Hkv, n_rep, S, Dh)  # (B, Hkv, n_rep, S, Dh)
    return x.reshape(B, Hkv * n_rep, S, Dh)  # (B, H, S, Dh)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    check_empty_rows: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(Dh)) v over (B, H, T, Dh) queries and (B, Hkv, S, Dh) keys/values.

    mask: bool, broadcastable to (B, H, T, S), True = may attend. `is_causal=True` is a shortcut
    for the lower-triangular mask and only valid without another mask and with T == S.
    A query row whose keys are all masked returns zeros (and zero weights), never NaN.
    check_empty_rows=False: the caller has checked that every query row of `mask` sees at least
    one key (`handformer.nn.masks.has_empty_rows`), so the per-call search for such rows (three
    elementwise passes over the mask and one over the output) is skipped; a model checks once
    per forward instead of once per layer.
    Returns (out (B, H, T, Dh), weights (B, H, T, S) if need_weights else None).
    """
    T, S = q.size(-2), k.size(-2)
    if is_causal and (mask is not None or T != S):
        raise ValueError("is_causal=True needs mask=None and equal query/key lengths; "
                         "pass an explicit causal mask (handformer.nn.masks.causal_mask) instead")
    n_rep = q.size(1) // k.size(1)

    visible_rows = None
    if mask is not None:
        if mask.dtype != torch.bool:
            raise TypeError(f"attention mask must be bool (True = may attend), got {mask.dtype}")
    if mask is not None and check_empty_rows:
        # Softmax over a row with no visible key is 0/0. Let such rows see every key (finite
        # values and gradients) and zero their output afterwards.
        visible_rows = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
        mask = mask | ~visible_rows

    if not need_weights:
        if n_rep > 1 and SDPA_SHARES_KV_HEADS:  # no copies of K and V, no sum over them in backward
            gqa = {"enable_gqa": True}
        else:
            k, v, gqa = repeat_kv(k, n_rep), repeat_kv(v, n_rep), {}  # (B, H, S, Dh)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                             is_causal=is_causal, **gqa)  # (B, H, T, Dh)
        if visible_rows is not None:
            out = out * visible_rows
        return out, None

    # Explicit path: the formula, step by step.
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, Dh)
    if is_causal:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()  # (T, S)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, H, T, S), rows sum to 1
    if visible_rows is not None:
        weights = weights * visible_rows
    dropped = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    out = dropped @ v  # (B, H, T, Dh)
    return out, weights


class MultiHeadAttention(nn.Module):
    """Multi-head attention: project to Q, K, V, split into heads, attend, concat, apply W_O.

    Self-attention when `context` is None, cross-attention (queries from x, keys and values from
    `context`, e.g. the encoder output) otherwise. `n_kv_heads < n_heads` gives grouped-query
    attention. With bias=True and n_kv_heads == n_heads it has 4 * D^2 weights + 4 * D biases.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                 bias: bool = True, dropout: float = 0.0, *, head_dim: int | None = None,
                 qkv_bias: bool | None = None) -> None:
        """head_dim: width of each head, d_model // n_heads by default (Gemma sets it wider).
        qkv_bias: biases on W_Q, W_K, W_V; by default the same as `bias` (Qwen2: only these)."""
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if head_dim is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads} "
                                 "(or give head_dim)")
            head_dim = d_model // n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be divisible by n_kv_heads={n_kv_heads}")
        qkv_bias = bias if qkv_bias is None else qkv_bias
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=qkv_bias)  # W_Q
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias)  # W_K
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=qkv_bias)  # W_V
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=bias)  # W_O

    def split_heads(self, x: Tensor, n_heads: int) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n_heads, self.head_dim).transpose(1, 2)  # (B, n_heads, T, Dh)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        rope: tuple[Tensor, Tensor] | None = None,
        cache: LayerKVCache | None = None,
        need_weights: bool = False,
        check_empty_rows: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D); context: (B, S, D) or None. Returns ((B, T, D), (B, H, T, S) or None).

        rope: (cos, sin) of shape (B|1, 1, T, Dh), rotates queries and keys (self-attention only).
        cache: this layer's KV cache; self-attention appends the new keys/values to it, cross-
        attention computes the context's keys/values once and reuses them afterwards.
        check_empty_rows: see `scaled_dot_product_attention`.
        """
        B, T, D = x.shape
        q = self.split_heads(self.q_proj(x), self.n_heads)  # (B, H, T, Dh)
        if context is None:
            k = self.split_heads(self.k_proj(x), self.n_kv_heads)  # (B, Hkv, T, Dh)
            v = self.split_heads(self.v_proj(x), self.n_kv_heads)  # (B, Hkv, T, Dh)
            if rope is not None:
                q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, Hkv, S, Dh): everything cached so far
        elif cache is not None and cache.cross is not None:
            k, v = cache.cross  # (B, Hkv, S, Dh), computed at the first decoding step
        else:
            k = self.split_heads(self.k_proj(context), self.n_kv_heads)  # (B, Hkv, S, Dh)
            v = self.split_heads(self.v_proj(context), self.n_kv_heads)  # (B, Hkv, S, Dh)
            if cache is not None:
                cache.cross = (k, v)

        out, weights = scaled_dot_product_attention(
            q, k, v, mask, is_causal=is_causal, need_weights=need_weights,
            dropout_p=self.dropout if self.training else 0.0,
            check_empty_rows=check_empty_rows)  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, H * Dh): concat
        return self.o_proj(out), weights
