"""What a variant of attention takes over from the lesson module it replaces."""

from __future__ import annotations

from torch import nn

from handformer.nn.attention import MultiHeadAttention


def adopt_attention(variant: MultiHeadAttention, attn: MultiHeadAttention) -> None:
    """Give `variant` (a MultiHeadAttention subclass whose __init__ skipped MultiHeadAttention's)
    the sizes, dropout, projections and q/k norms of `attn`: the same weights, the same names."""
    nn.Module.__init__(variant)
    variant.n_heads, variant.n_kv_heads, variant.head_dim = attn.n_heads, attn.n_kv_heads, attn.head_dim
    variant.dropout = attn.dropout
    variant.q_proj, variant.k_proj = attn.q_proj, attn.k_proj
    variant.v_proj, variant.o_proj = attn.v_proj, attn.o_proj
    variant.q_norm, variant.k_norm = attn.q_norm, attn.k_norm
    variant.train(attn.training)
