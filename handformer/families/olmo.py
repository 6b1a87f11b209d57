"""OLMo 2: where its block differs from the lesson's decoder-only block.

- Each sublayer's *output* is normed, inside the residual branch ("reordered norm", OLMo 2 paper
  section 3.3): x = x + norm(f(x)), where pre-norm writes x = x + f(norm(x)); the residual stream
  itself is never normed until the final norm (`ReorderedNormBlock`).
- Queries and keys are normed over their whole width, all heads together, right after their
  projections and before the split into heads and RoPE (`WidthQKNormAttention`); Qwen3 and Gemma 3
  norm each head on its own (the lesson's `qk_norm="head"`).

Shape legend: B batch, T query length, S key length, D d_model, H heads, Hkv key/value heads,
Dh head dim.
"""

from __future__ import annotations

from torch import Tensor, nn

from handformer.config import CausalLMConfig
from handformer.families.adopt import adopt_attention
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.blocks import DecoderOnlyBlock
from handformer.nn.kv_cache import NO_CACHE, LayerCache, LayerKVCache
from handformer.nn.masks import AttentionMask, as_attention_mask
from handformer.nn.norms import make_norm
from handformer.nn.positions import apply_rotary


class ReorderedNormBlock(DecoderOnlyBlock):
    """OLMo 2's block: attention -> norm -> add, FFN -> norm -> add."""

    def __init__(self, block: DecoderOnlyBlock) -> None:
        nn.Module.__init__(self)  # the lesson block's modules; its two norms now norm the outputs
        self.pre_norm, self.sliding = False, block.sliding
        self.self_attn = block.self_attn
        self.attn_norm = block.attn_norm  # after attention (OLMo 2's post_attention_layernorm)
        self.ffn = block.ffn
        self.ffn_norm = block.ffn_norm  # after the FFN (post_feedforward_layernorm)
        self.dropout = block.dropout
        self.train(block.training)

    def forward(self, x: Tensor, mask: AttentionMask | Tensor | None = None, *,
                rope: tuple[Tensor, Tensor] | None = None, cache: LayerKVCache | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D) -> ((B, T, D), weights (B, H, T, S) or None)."""
        mask = as_attention_mask(mask).of_layer(self.sliding)
        h, weights = self.self_attn(x, mask=mask, rope=rope, cache=cache, need_weights=need_weights)
        x = x + self.dropout(self.attn_norm(h))
        x = x + self.dropout(self.ffn_norm(self.ffn(x)))
        return x, weights


class WidthQKNormAttention(MultiHeadAttention):
    """`MultiHeadAttention` with q_norm over all H * Dh query dims and k_norm over all Hkv * Dh key
    dims, before the heads are split. Only `project` differs."""

    def __init__(self, attn: MultiHeadAttention, cfg: CausalLMConfig) -> None:
        adopt_attention(self, attn)  # then norms over the whole width in place of the per-head ones
        self.q_norm = make_norm(cfg.norm, self.n_heads * self.head_dim, cfg.norm_eps, cfg.bias)  # (H * Dh,)
        self.k_norm = make_norm(cfg.norm, self.n_kv_heads * self.head_dim, cfg.norm_eps, cfg.bias)

    def project(self, query: Tensor, key: Tensor, value: Tensor, rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerCache = NO_CACHE) -> tuple[Tensor, Tensor, Tensor]:
        """Q and K normed over their width, then split into heads and turned by RoPE."""
        q = self.split_heads(self.q_norm(self.q_proj(query)), self.n_heads)  # (B, T, H*Dh) -> (B, H, T, Dh)
        k = self.split_heads(self.k_norm(self.k_proj(key)), self.n_kv_heads)  # (B, Hkv, S, Dh)
        v = self.split_heads(self.v_proj(value), self.n_kv_heads)  # (B, Hkv, S, Dh)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        return q, k, v


__all__ = ["ReorderedNormBlock", "WidthQKNormAttention"]
