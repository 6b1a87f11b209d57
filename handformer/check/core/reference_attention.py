"""handformer's attention holding the learner's weights: what the attention and layer runners compare
the learner's module with, rotary pairs and QK-norm included."""

from __future__ import annotations

import torch

from handformer.check.core.context import D, H
from handformer.check.core.rotary import interleaved_to_half_
from handformer.check.core.weights import QK_NORM_ROLES, Slot, copy_attention, norm_eps, norm_kind
from handformer.nn.attention import MultiHeadAttention


def handformer_attention(slots: list[Slot], n_kv_heads: int | None = None, rope: str | None = None,
                         heads: int = H) -> MultiHeadAttention:
    """handformer's attention with the learner's weights. Interleaved rotary pairs (Meta's) become
    handformer's half-split ones by permuting each head's rows of W_Q and W_K: q.k is unchanged."""
    qk = next((s.leaf for s in slots if s.role in QK_NORM_ROLES), None)
    kind = norm_kind(qk) if qk else "none"
    eps = norm_eps(qk.module, kind) if qk else 1e-6
    hf = MultiHeadAttention(D, heads, n_kv_heads, qk_norm=kind, norm_eps=eps).double().eval()
    copy_attention(hf, slots)
    if heads == 1 and not any(s.role.endswith("W_O") for s in slots):  # one head, no output projection
        with torch.no_grad():
            hf.o_proj.weight.copy_(torch.eye(D))
            if hf.o_proj.bias is not None:
                hf.o_proj.bias.zero_()
    if rope in ("interleaved", "swapped"):
        interleaved_to_half_(hf, heads, swapped=rope == "swapped")
    return hf
