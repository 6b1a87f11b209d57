"""The layers that stack into models: encoder layer, decoder layer, decoder-only block.

Each sublayer (attention or feed-forward) is wrapped in a residual connection with a norm, placed
either as in the paper (post-norm) or as in modern LLMs (pre-norm):

    post-norm:  x = norm(x + dropout(sublayer(x)))
    pre-norm:   x = x + dropout(sublayer(norm(x)))

Both are written out in each forward below so the data flow reads like the tutorials.

Shape legend: B batch, T target/query length, S source/key length, D d_model, H heads.
"""

from __future__ import annotations

from torch import Tensor, nn

from handformer.config import BlockConfig
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.feed_forward import FeedForward
from handformer.nn.kv_cache import LayerKVCache
from handformer.nn.norms import make_norm


def _attention(cfg: BlockConfig) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, bias=cfg.bias,
                              dropout=cfg.attention_dropout, head_dim=cfg.head_dim,
                              qkv_bias=cfg.bias or cfg.qkv_bias)


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network; each with residual + norm (paper figure 1, left)."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.pre_norm = cfg.norm_placement == "pre"
        self.self_attn = _attention(cfg)
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.bias)
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()

    def forward(self, x: Tensor, mask: Tensor | None = None, *, is_causal: bool = False,
                rope: tuple[Tensor, Tensor] | None = None, cache: LayerKVCache | None = None,
                need_weights: bool = False, check_empty_rows: bool = True,
                ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D) -> ((B, T, D), self-attention weights (B, H, T, S) or None).
        check_empty_rows: see `handformer.nn.attention.scaled_dot_product_attention`."""
        if self.pre_norm:
            h, weights = self.self_attn(self.attn_norm(x), mask=mask, is_causal=is_causal,
                                        rope=rope, cache=cache, need_weights=need_weights,
                                        check_empty_rows=check_empty_rows)
            x = x + self.dropout(h)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            h, weights = self.self_attn(x, mask=mask, is_causal=is_causal, rope=rope, cache=cache,
                                        need_weights=need_weights, check_empty_rows=check_empty_rows)
            x = self.attn_norm(x + self.dropout(h))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, weights


class DecoderOnlyBlock(EncoderLayer):
    """The block of GPT-style models: the same two sublayers as the encoder layer.

    What makes it a decoder is the mask it is given: causal, so position t only sees 0..t. The
    model passes a rotary embedding and a KV cache where the architecture uses them.
    """


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward (figure 1, right)."""

    def __init__(self, cfg: BlockConfig) -> None:
        super().__init__()
        self.pre_norm = cfg.norm_placement == "pre"
        self.self_attn = _attention(cfg)
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.cross_attn = _attention(cfg)
        self.cross_attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.bias)
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()

    def forward(self, x: Tensor, memory: Tensor, *, self_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, is_causal: bool = False,
                cache: LayerKVCache | None = None, need_weights: bool = False,
                check_empty_memory_rows: bool = True,
                ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x: (B, T, D), memory: (B, S, D) -> ((B, T, D), self weights (B, H, T, T) or None,
        cross weights (B, H, T, S) or None). check_empty_memory_rows=False: the caller has checked
        that `memory_mask` has no row without a visible key (see `scaled_dot_product_attention`).

        The two masks are keyword-only: tutorials pass `(src_mask, tgt_mask)` in the opposite order,
        and both broadcast to the same shapes, so a positional call could swap them silently."""
        if self.pre_norm:
            h, self_w = self.self_attn(self.attn_norm(x), mask=self_mask, is_causal=is_causal,
                                       cache=cache, need_weights=need_weights)
            x = x + self.dropout(h)
            h, cross_w = self.cross_attn(self.cross_attn_norm(x), memory, mask=memory_mask,
                                         cache=cache, need_weights=need_weights,
                                         check_empty_rows=check_empty_memory_rows)
            x = x + self.dropout(h)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            h, self_w = self.self_attn(x, mask=self_mask, is_causal=is_causal, cache=cache,
                                       need_weights=need_weights)
            x = self.attn_norm(x + self.dropout(h))
            h, cross_w = self.cross_attn(x, memory, mask=memory_mask, cache=cache,
                                         need_weights=need_weights, check_empty_rows=check_empty_memory_rows)
            x = self.cross_attn_norm(x + self.dropout(h))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, self_w, cross_w
