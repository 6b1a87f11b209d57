"""The layers that stack into models: encoder layer, decoder layer, decoder-only block.

Each sublayer (attention or feed-forward) is wrapped in a residual connection with a norm, the
tutorial's "Add & Norm", placed either as in the paper (post-norm) or as in modern LLMs (pre-norm):

    post-norm:  x = norm(x + dropout(sublayer(x)))
    pre-norm:   x = x + dropout(sublayer(norm(x)))

Both are written out in each forward below so the data flow reads like the tutorials.

Shape legend: B batch, T target/query length, S source/key length, D d_model, H heads,
Dh head dim.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from handformer.config import BlockConfig
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.dropout import make_dropout
from handformer.nn.feed_forward import FeedForward
from handformer.nn.kv_cache import LayerKVCache, as_cache
from handformer.nn.masks import AttentionMask, as_attention_mask
from handformer.nn.moe import MixtureOfExperts
from handformer.nn.norms import make_norm

Mask = AttentionMask | Tensor | None  # see handformer.nn.masks


def _attention(cfg: BlockConfig) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, bias=cfg.bias,
                              dropout=cfg.attention_dropout, head_dim=cfg.head_dim, qkv_bias=cfg.qkv_bias,
                              qk_norm=cfg.head_qk_norm, norm_eps=cfg.norm_eps)


def feed_forward(cfg: BlockConfig) -> nn.Module:
    """A decoder-only block's FFN: one network, or a mixture of experts (`cfg.moe`: Mixtral)."""
    if cfg.moe is None:
        return FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.bias)
    m = cfg.moe
    return MixtureOfExperts(cfg.d_model, m.n_experts, m.top_k, m.d_expert or cfg.d_ff, cfg.activation,
                            m.normalize, m.d_shared)


def collect(weights: list[Tensor | None], need_weights: bool) -> tuple[Tensor, ...] | None:
    """The attention weights of every layer as a tuple, or None when they were not asked for."""
    return tuple(weights) if need_weights else None


def require_config(layer: str, cfg: Any, more: tuple[Any, ...]) -> None:
    """A layer is built from a BlockConfig; the tutorials' EncoderLayer(512, 8, 2048) is a
    TypeError that shows the line to write."""
    if more or not isinstance(cfg, BlockConfig):
        raise TypeError(_config_line(layer, (cfg, *more)))


def _config_line(layer: str, sizes: tuple[Any, ...]) -> str:
    named = zip(("d_model", "n_heads", "d_ff", "dropout"), sizes, strict=False)
    fields = ", ".join(f"{name}={value!r}" for name, value in named)
    return (f"{layer} takes one BlockConfig: write {layer}(BlockConfig({fields})) (from handformer.config "
            "import BlockConfig; its other fields default to the paper's post-norm layer)")


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network; each with Add & Norm (paper figure 1, left)."""

    def __init__(self, cfg: BlockConfig, *tutorial_sizes: Any) -> None:
        require_config("EncoderLayer", cfg, tutorial_sizes)
        super().__init__()
        self.pre_norm = cfg.norm_placement == "pre"
        self.self_attn = _attention(cfg)
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.bias)
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.dropout = make_dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Mask = None, *, need_weights: bool = False,
                ) -> tuple[Tensor, Tensor | None]:
        """x: (B, S, D), mask: the source padding mask -> ((B, S, D), weights (B, H, S, S) or None)."""
        if self.pre_norm:
            h, weights = self.self_attn(self.attn_norm(x), mask=mask, need_weights=need_weights)
            x = x + self.dropout(h)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            h, weights = self.self_attn(x, mask=mask, need_weights=need_weights)
            x = self.attn_norm(x + self.dropout(h))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder output, feed-forward (figure 1, right)."""

    def __init__(self, cfg: BlockConfig, *tutorial_sizes: Any) -> None:
        require_config("DecoderLayer", cfg, tutorial_sizes)
        super().__init__()
        self.pre_norm = cfg.norm_placement == "pre"
        self.self_attn = _attention(cfg)
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.cross_attn = _attention(cfg)
        self.cross_attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.bias)
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.dropout = make_dropout(cfg.dropout)

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Mask = None, self_mask: Mask = None, *,
                cache: LayerKVCache | None = None, need_weights: bool = False,
                ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x: (B, T, D), memory: (B, S, D) the encoder output. The masks come in the tutorial's
        order, `layer(x, memory, src_mask, tgt_mask)`: the source padding mask for cross-attention,
        then the causal + target padding mask for self-attention. cache: while decoding.
        Returns ((B, T, D), self weights (B, H, T, T) or None, cross weights (B, H, T, S) or None)."""
        memory_cache = as_cache(cache).memory  # cross-attention's part of the layer's KV cache
        if self.pre_norm:
            h, self_w = self.self_attn(self.attn_norm(x), mask=self_mask, cache=cache,
                                       need_weights=need_weights)
            x = x + self.dropout(h)
            h, cross_w = self.cross_attn(self.cross_attn_norm(x), memory, mask=memory_mask,
                                         cache=memory_cache, need_weights=need_weights)
            x = x + self.dropout(h)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            h, self_w = self.self_attn(x, mask=self_mask, cache=cache, need_weights=need_weights)
            x = self.attn_norm(x + self.dropout(h))
            h, cross_w = self.cross_attn(x, memory, mask=memory_mask, cache=memory_cache,
                                         need_weights=need_weights)
            x = self.cross_attn_norm(x + self.dropout(h))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, self_w, cross_w


class DecoderOnlyBlock(nn.Module):
    """The block of GPT-style language models: causal self-attention, then the feed-forward network,
    each with Add & Norm. Pre-norm (GPT-2, Llama) reads norm -> attention -> add -> norm -> FFN ->
    add. What makes it a decoder is the mask it is given: causal, so position t only sees 0..t.
    rope: rotary positions (Llama); cache: the KV cache while generating. sliding: this layer
    attends within the window of a model whose other layers are global (the mask's `sliding` kind)."""

    def __init__(self, cfg: BlockConfig, sliding: bool = False) -> None:
        require_config("DecoderOnlyBlock", cfg, ())
        super().__init__()
        self.pre_norm = cfg.norm_placement != "post"  # (sandwich and reordered: handformer.families)
        self.sliding = sliding
        self.self_attn = _attention(cfg)
        self.attn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.ffn = feed_forward(cfg)  # (B, T, D) -> (B, T, D)
        self.ffn_norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps, cfg.bias)
        self.dropout = make_dropout(cfg.dropout)

    def forward(self, x: Tensor, mask: Mask = None, *, rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerKVCache | None = None, need_weights: bool = False,
                ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D), mask: causal (the model's AttentionMask) -> ((B, T, D), weights (B, H, T, S)
        or None); S counts the cached positions too."""
        mask = as_attention_mask(mask).of_layer(self.sliding)  # this layer's kind: sliding or global
        if self.pre_norm:
            h, weights = self.self_attn(self.attn_norm(x), mask=mask, rope=rope, cache=cache,
                                        need_weights=need_weights)
            x = x + self.dropout(h)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))
        else:
            h, weights = self.self_attn(x, mask=mask, rope=rope, cache=cache, need_weights=need_weights)
            x = self.attn_norm(x + self.dropout(h))
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))
        return x, weights
