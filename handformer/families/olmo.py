"""OLMo 2 and OLMoE: their family specs, and where OLMo 2's block differs from the lesson's block.

OLMoE is the lesson's pre-norm block with q/k norms over the width and a mixture of experts, the
top-k weights not renormalized by default. OLMo 2:

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

from typing import Any

from torch import Tensor, nn

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.adopt import adopt_attention
from handformer.families.gemma import Rope, layer_rope
from handformer.families.hf_config import (
    expert_keys,
    expert_width,
    experts,
    no_attention_bias,
    rope_decoder,
    rope_decoder_keys,
    silu_only,
)
from handformer.families.mixtral import EXPERT_KEYS, expert_problems
from handformer.families.qwen import MOE_TENSORS
from handformer.families.spec import Differences, FamilySpec, GgufEntry
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
                rope: Rope = None, cache: LayerKVCache | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D) -> ((B, T, D), weights (B, H, T, S) or None); the mask and rope of the
        layer's kind (OLMo 3's sliding layers have a RoPE of their own when its global ones use YaRN)."""
        mask = as_attention_mask(mask).of_layer(self.sliding)
        rope = layer_rope(rope, self.sliding)
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


__all__ = ["OLMO2", "OLMOE", "ReorderedNormBlock", "WidthQKNormAttention"]


# --- the family specs ----------------------------------------------------------------------------

REORDERED = ("reordered", "puts its norms after each sublayer")


def _olmo2(c: dict[str, Any]) -> CausalLMConfig:
    """OLMo 2: norms on each sublayer's output (the reordered norm), q/k norms over the whole width,
    rms_norm_eps 1e-5 by default."""
    silu_only(c)
    no_attention_bias(c)
    return rope_decoder(c, norm_placement="reordered", qk_norm="width", norm_eps=c.get("rms_norm_eps", 1e-5))


_NO_WINDOW = {"sliding_window": llama.NO_WINDOW}
OLMO2 = FamilySpec(
    model_type="olmo2", name="OLMo 2", hf_class="Olmo2ForCausalLM",
    fixed={**llama.LLAMA_BLOCK, **llama.NO_BIASES, **_NO_WINDOW, "norm_placement": REORDERED,
           "qk_norm": llama.WIDTH_QK_NORM},
    from_hf_config=_olmo2, to_hf_config=lambda cfg: {**rope_decoder_keys(cfg), "attention_bias": False},
    # the norms sit on the sublayers' outputs (ReorderedNormBlock), q/k norms over the width
    tensors=llama.llama_like(llama.linears({**llama.ATTENTION, **llama.MLP}), llama.QK_NORMS, llama.norms({
        "post_attention_layernorm": "attn_norm", "post_feedforward_layernorm": "ffn_norm"})),
    gguf=GgufEntry("olmo2", "olmo2", "OLMo 2", {  # the norms come after each sublayer
        **{name: keys for name, keys in llama.GGUF_TENSORS.items() if name not in llama.GGUF_NORMS},
        **llama.GGUF_QK_NORMS, "blk.{i}.post_attention_norm.weight": ("layers.{i}.attn_norm.weight",),
        "blk.{i}.post_ffw_norm.weight": ("layers.{i}.ffn_norm.weight",)},
        {**llama.GGUF_BLOCK, **llama.NO_BIASES, "norm_placement": REORDERED, "qk_norm": llama.WIDTH_QK_NORM,
         **_NO_WINDOW, "rope_scaling": llama.NO_SCALING_IN_LLAMA_CPP}, biases=()),
    may_set=frozenset({"qk_norm"}), variants=("ReorderedNormBlock", "WidthQKNormAttention"),
    claims=((30, lambda c: c.norm_placement == "reordered" or c.qk_norm == "width"),),
    look_alikes={"olmo": "OLMo (1) uses LayerNorm without parameters; OLMo 2 (model_type 'olmo2') "
                         "is imported"},
    differences=Differences(norm="on each sublayer's output", attention="q/k norms over the whole width"))


def _olmoe(c: dict[str, Any]) -> CausalLMConfig:
    """OLMoE: pre-norm blocks with q/k norms over the width and a mixture of experts, top-k weights
    not renormalized by default."""
    silu_only(c)
    no_attention_bias(c)
    moe = experts(c, None, c.get("norm_topk_prob", False))  # experts of intermediate_size, the d_ff
    return rope_decoder(c, qk_norm="width", moe=moe, norm_eps=c.get("rms_norm_eps", 1e-5))


def _olmoe_keys(cfg: CausalLMConfig) -> dict[str, Any]:
    assert cfg.moe is not None
    return {**rope_decoder_keys(cfg), **expert_keys(cfg), "intermediate_size": expert_width(cfg),
            "norm_topk_prob": cfg.moe.normalize, "clip_qkv": None, "attention_bias": False}


OLMOE = FamilySpec(
    model_type="olmoe", name="OLMoE", hf_class="OlmoeForCausalLM",
    fixed={**llama.LLAMA_BLOCK, **llama.NO_BIASES, **_NO_WINDOW, "qk_norm": llama.WIDTH_QK_NORM},
    from_hf_config=_olmoe, to_hf_config=_olmoe_keys, tensors=MOE_TENSORS,
    may_set=frozenset({"qk_norm", "moe"}), hf_keys=EXPERT_KEYS, variants=("WidthQKNormAttention",),
    problems=lambda cfg: expert_problems(cfg, "OLMoE", shared=False),
    claims=((12, lambda c: c.moe is not None and c.qk_norm == "width"),),
    gguf_unread={"olmoe": "OLMoE has a mixture of experts and q/k norms"},
    differences=Differences(attention="q/k norms over the whole width", ffn="a mixture of experts"))

