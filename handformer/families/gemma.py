"""Gemma 2 and Gemma 3: where their blocks differ from the lesson's decoder-only block.

- Norms before *and* after each sublayer ("sandwich"): x = x + post_norm(f(pre_norm(x))), four
  norms a block where the lesson has two (`SandwichBlock`).
- Attention scores times 1/sqrt(query_pre_attn_scalar) instead of 1/sqrt(head_dim) and, in
  Gemma 2, soft-capped: s -> c * tanh(s / c), so no score passes +-c (`GemmaAttention`).
- The output logits soft-capped too (Gemma 2, `SoftcappedHead`).
- Gemma 3: the sliding-window layers turn queries and keys with a RoPE base of their own (10 000;
  the global layers 1 000 000, possibly scaled): `LocalGlobalRotary` hands both to every block,
  and each block takes its kind's.

What stays the lesson's: the sliding and global kinds of layer (the mask's `sliding` kind, the KV
cache's `global_layers`), q/k norms per head (Gemma 3), RMSNorm with gain 1 + w, GeGLU, the
embeddings times sqrt(d_model).

Shape legend: B batch, T query length, S key length, D d_model, H heads, Dh head dim, V vocab.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from handformer.config import CausalLMConfig
from handformer.families.adopt import adopt_attention
from handformer.nn.attention import SDPA_SHARES_KV_HEADS, MultiHeadAttention, repeat_kv
from handformer.nn.blocks import DecoderOnlyBlock
from handformer.nn.kv_cache import LayerKVCache
from handformer.nn.masks import AttentionMask, as_attention_mask
from handformer.nn.norms import make_norm
from handformer.nn.positions import RotaryEmbedding

Rope = tuple[Tensor, Tensor] | dict[str, tuple[Tensor, Tensor]] | None


class SandwichBlock(DecoderOnlyBlock):
    """Gemma 2/3's block: norm -> attention -> norm -> add, norm -> FFN -> norm -> add."""

    def __init__(self, block: DecoderOnlyBlock, cfg: CausalLMConfig) -> None:
        nn.Module.__init__(self)  # the lesson block's modules, and a norm after each sublayer
        self.pre_norm, self.sliding = True, block.sliding
        self.self_attn = block.self_attn
        self.attn_norm = block.attn_norm  # before attention (Gemma's input_layernorm)
        self.post_attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.ffn = block.ffn
        self.ffn_norm = block.ffn_norm  # before the FFN (pre_feedforward_layernorm)
        self.post_ffn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.dropout = block.dropout
        self.train(block.training)

    def forward(self, x: Tensor, mask: AttentionMask | Tensor | None = None, *, rope: Rope = None,
                cache: LayerKVCache | None = None, need_weights: bool = False,
                ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D) -> ((B, T, D), weights (B, H, T, S) or None); mask and rope of the
        layer's kind (sliding or global)."""
        mask = as_attention_mask(mask).of_layer(self.sliding)
        rope = layer_rope(rope, self.sliding)
        h, weights = self.self_attn(self.attn_norm(x), mask=mask, rope=rope, cache=cache,
                                    need_weights=need_weights)
        x = x + self.dropout(self.post_attn_norm(h))
        x = x + self.dropout(self.post_ffn_norm(self.ffn(self.ffn_norm(x))))
        return x, weights


def layer_rope(rope: Rope, sliding: bool) -> tuple[Tensor, Tensor] | None:
    """A layer's (cos, sin): Gemma 3 hands every layer both kinds, by name; the others one pair."""
    if isinstance(rope, dict):
        return rope["sliding" if sliding else "global"]
    return rope


def scaled_attention(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | Tensor | None, scale: float,
                     cap: float | None = None, dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """softmax(q k^T * scale) v, the scores soft-capped at +-cap first when `cap` is given
    (Gemma 2: cap * tanh(scores / cap)), step by step as transformers' eager attention does.
    q (B, H, T, Dh), k and v (B, Hkv, S, Dh) -> (out (B, H, T, Dh), weights (B, H, T, S))."""
    mask = as_attention_mask(mask)
    n_rep = q.size(1) // k.size(1)
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)  # (B, H, S, Dh)
    scores = q @ k.transpose(-2, -1) * scale  # (B, H, T, S)
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)  # soft-capped: |score| < cap
    allowed = mask.dense(q.size(-2), k.size(-2), q.device)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # (B, H, T, S), softmax in float32
    out = F.dropout(weights, p=dropout_p, training=dropout_p > 0) @ v  # (B, H, T, Dh)
    return mask.zero_empty_rows(out), mask.zero_empty_rows(weights)


def fused_scaled_attention(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | Tensor | None,
                           scale: float, dropout_p: float = 0.0) -> Tensor:
    """The fused kernel with a scale of its own (no cap: no fused kernel soft-caps)."""
    mask = as_attention_mask(mask)
    if not SDPA_SHARES_KV_HEADS:  # torch 2.4: the key/value heads repeated first
        n_rep = q.size(1) // k.size(1)
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    gqa = {"enable_gqa": k.size(1) != q.size(1)} if SDPA_SHARES_KV_HEADS else {}
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.allowed, dropout_p=dropout_p,
                                         is_causal=mask.is_causal, scale=scale, **gqa)  # (B, H, T, Dh)
    return mask.zero_empty_rows(out)


class GemmaAttention(MultiHeadAttention):
    """`MultiHeadAttention` whose scores are q.k / sqrt(scale_dim) (Gemma's query_pre_attn_scalar)
    and, with `softcap`, soft-capped. Only `attend` differs."""

    def __init__(self, attn: MultiHeadAttention, scale_dim: float, softcap: float | None) -> None:
        adopt_attention(self, attn)  # the lesson attention's projections and q/k norms, as they are
        self.scale, self.softcap = scale_dim ** -0.5, softcap

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | Tensor | None,
               need_weights: bool) -> tuple[Tensor, Tensor | None]:
        dropout_p = self.dropout * self.training
        if self.softcap is not None or need_weights:  # no fused kernel caps scores or returns weights
            out, weights = scaled_attention(q, k, v, mask, self.scale, self.softcap, dropout_p)
            return out, weights if need_weights else None
        return fused_scaled_attention(q, k, v, mask, self.scale, dropout_p), None


class SoftcappedHead(nn.Module):
    """The output head with soft-capped logits, c * tanh(x W^T / c) (Gemma 2). It keeps the head's
    `weight` under the same name (tied to the embedding where the model ties them)."""

    def __init__(self, head: nn.Linear, cap: float) -> None:
        super().__init__()
        self.weight = head.weight  # (V, D)
        self.cap = cap

    def forward(self, x: Tensor) -> Tensor:
        return self.cap * torch.tanh(F.linear(x, self.weight) / self.cap)  # (B, T, V)


class LocalGlobalRotary(nn.Module):
    """Gemma 3's two RoPEs: the global layers' (rope_theta, with the model's scaling) and the
    sliding layers' (rope_local_theta, unscaled). Returns both, by name, for each block to pick."""

    def __init__(self, cfg: CausalLMConfig) -> None:
        super().__init__()
        dims, positions = cfg.rotary_dim, cfg.max_positions
        self.global_rope = RotaryEmbedding(dims, positions, cfg.rope_theta, cfg.rope_scaling)
        self.sliding_rope = RotaryEmbedding(dims, positions, cfg.rope_local_theta)

    def forward(self, position_ids: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
        """(B, T) -> {"global": (cos, sin), "sliding": (cos, sin)}, each (B, 1, T, Dh)."""
        return {"global": self.global_rope(position_ids), "sliding": self.sliding_rope(position_ids)}


__all__ = ["GemmaAttention", "LocalGlobalRotary", "SandwichBlock", "SoftcappedHead", "fused_scaled_attention",
           "scaled_attention"]
