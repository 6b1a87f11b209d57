"""handformer's attention holding the learner's weights: what the attention and layer runners compare
the learner's module with, rotary pairs and QK-norm included."""

from __future__ import annotations

from torch import Tensor, nn

from handformer.check.core.context import D, H
from handformer.check.core.rotary import interleaved_to_half_
from handformer.check.core.weights import (
    QK_NORM_ROLES,
    RELATIVE_ROLE,
    SINKS_ROLE,
    Slot,
    copy_attention,
    norm_eps,
    norm_kind,
)
from handformer.check.reference import variants as V
from handformer.families.gemma import GemmaAttention
from handformer.families.gpt_oss import SinkAttention
from handformer.nn.attention import MultiHeadAttention, repeat_kv
from handformer.nn.masks import AttentionMask, as_attention_mask
from handformer.nn.norms import make_norm


class AcrossHeads(nn.Module):
    """A norm over all the heads of (B, H, T, Dh) queries or keys together (OLMo-2's QK-norm, applied
    before the heads are split), in the place of handformer's per-head q_norm or k_norm."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.weight, self.bias = norm.weight, getattr(norm, "bias", None)  # what copy_attention fills

    def forward(self, x: Tensor) -> Tensor:
        B, heads, T, Dh = x.shape
        whole = self.norm(x.transpose(1, 2).reshape(B, T, heads * Dh))  # (B, T, H * Dh)
        return whole.view(B, T, heads, Dh).transpose(1, 2)  # (B, H, T, Dh)


class BiasedAttention(MultiHeadAttention):
    """handformer's attention whose scores take a positional term (`positions`: ALiBi's slopes, T5's
    learned relative-position bias held in `relative`) and, for T5's, no 1/sqrt(Dh). Only `attend`
    differs: the formula with the term added after the scale."""

    def __init__(self, heads: int, n_kv_heads: int | None, positions: str) -> None:
        super().__init__(D, heads, n_kv_heads)
        self.positions = positions

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask | Tensor | None,
               need_weights: bool) -> tuple[Tensor, Tensor | None]:
        mask = as_attention_mask(mask)
        table = self.relative.weight if hasattr(self, "relative") else None
        w = V.MHAWeights(*[(p.weight, p.bias) for p in (self.q_proj, self.k_proj, self.v_proj, self.o_proj)],
                         self.n_heads, rope=self.positions, table=table)
        bias = V.score_bias(w, q.size(-2), k.size(-2))
        n_rep = q.size(1) // k.size(1)
        keep = mask.dense(q.size(-2), k.size(-2), q.device)
        out, weights = V.attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), keep, frozenset(), bias,
                                   self.positions not in V.UNSCALED)  # (a query that sees no key: zeros)
        return mask.zero_empty_rows(out), mask.zero_empty_rows(weights)


def handformer_attention(slots: list[Slot], n_kv_heads: int | None = None, rope: str | None = None,
                         heads: int = H, softcap: float | None = None, scale: float | None = None,
                         ) -> MultiHeadAttention:
    """handformer's attention with the learner's weights. Interleaved rotary pairs (Meta's) become
    handformer's half-split ones by permuting each head's rows of W_Q and W_K: q.k is unchanged.
    Positions as a term on the scores (ALiBi's, T5's): `BiasedAttention`, T5's table copied in.
    Scores soft-capped (Gemma 2's) or at a configured scale (Granite's attention_multiplier):
    handformer's `GemmaAttention`, at the usual scale where none is configured."""
    qk = next((s.leaf for s in slots if s.role in QK_NORM_ROLES), None)
    kind = norm_kind(qk) if qk else "none"
    eps = norm_eps(qk.module, kind) if qk else 1e-6
    if rope in V.SCORE_BIASES:
        hf = BiasedAttention(heads, n_kv_heads, rope).double().eval()
        table = next((s.leaf.weight for s in slots if s.role == RELATIVE_ROLE), None)
        if table is not None:
            hf.relative = nn.Embedding.from_pretrained(table.detach().double().clone(), freeze=False)
    else:
        hf = MultiHeadAttention(D, heads, n_kv_heads, qk_norm=kind, norm_eps=eps).double().eval()
    if qk is not None and qk.weight.numel() != D // heads:  # OLMo-2's: one norm over all the heads
        hf.q_norm, hf.k_norm = (AcrossHeads(make_norm(kind, s.weight().numel(), eps)).double()
                                for s in slots if s.role in QK_NORM_ROLES)
    copy_attention(hf, slots)  # no W_O (one head, or none at all): the identity
    if rope in ("interleaved", "swapped"):
        interleaved_to_half_(hf, heads, swapped=rope == "swapped")
    hf = with_sinks(hf, slots)
    if softcap is None and scale is None:
        return hf
    return GemmaAttention(hf, scale ** -2 if scale else D // heads, softcap)  # Gemma's q.k / sqrt(scale_dim)


def with_sinks(hf: MultiHeadAttention, slots: list[Slot]) -> MultiHeadAttention:
    """handformer's attention, as handformer's SinkAttention holding the learner's sink logits where its
    slots have them (gpt-oss's)."""
    sinks = [s.weight() for s in slots if s.role == SINKS_ROLE]
    if not sinks:
        return hf
    hf = SinkAttention(hf)
    hf.sinks.data = sinks[0].detach().double().clone()
    return hf
