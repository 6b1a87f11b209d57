"""Gemma 1, 2 and 3: their family specs, and where their blocks differ from the lesson's block.

Gemma (1) is Llama's block with RMSNorm of gain 1 + w, a GeGLU MLP with the tanh GELU, the
embeddings times sqrt(d_model), a tied head and a head_dim of its own. Gemma 2 and Gemma 3:

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

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import handformer.families.llama as llama
from handformer.config import CausalLMConfig, LinearRopeScaling
from handformer.families.adopt import adopt_attention
from handformer.families.hf_config import (
    layer_types_keys,
    no_attention_bias,
    require,
    rope,
    rope_decoder,
    rope_decoder_keys,
    rope_parameters,
    rope_parameters_keys,
    unsupported,
    window_settings,
)
from handformer.families.spec import Differences, FamilySpec, GgufEntry
from handformer.nn.attention import SDPA_SHARES_KV_HEADS, MultiHeadAttention, repeat_kv
from handformer.nn.blocks import DecoderOnlyBlock
from handformer.nn.kv_cache import LayerKVCache
from handformer.nn.masks import AttentionMask, as_attention_mask
from handformer.nn.norms import make_norm
from handformer.nn.positions import ROTARY_CLASSES, RotaryEmbedding

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
    wide = torch.promote_types(scores.dtype, torch.float32)  # float32 at least: a float64 model keeps float64
    weights = torch.softmax(scores, dim=-1, dtype=wide).to(q.dtype)  # (B, H, T, S)
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
    """Gemma 3's (and OLMo 3's) two RoPEs: the global layers' (rope_theta, with the model's
    scaling) and the sliding layers' (rope_local_theta, unscaled). Returns both, by name, for each
    block to pick."""

    def __init__(self, cfg: CausalLMConfig) -> None:
        super().__init__()
        dims, positions = cfg.rotary_dim, cfg.max_positions
        rotary = ROTARY_CLASSES.get(type(cfg.rope_scaling), RotaryEmbedding)  # YaRN: OLMo 3's
        self.global_rope = rotary(dims, positions, cfg.rope_theta, cfg.rope_scaling)
        self.sliding_rope = RotaryEmbedding(dims, positions, cfg.family.rope_local_theta)

    def forward(self, position_ids: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
        """(B, T) -> {"global": (cos, sin), "sliding": (cos, sin)}, each (B, 1, T, Dh)."""
        return {"global": self.global_rope(position_ids), "sliding": self.sliding_rope(position_ids)}


# --- the family specs ----------------------------------------------------------------------------

GEMMA_BLOCK = {"norm": ("rmsnorm_offset", "has RMSNorm with gain 1 + w"),
               "activation": ("geglu_tanh", "has a GeGLU MLP with the tanh GELU"),
               "scale_embeddings": (True, "scales embeddings by sqrt(d_model)"), **llama.NO_BIASES}
SANDWICH = ("sandwich", "has norms before and after each sublayer")
_GEMMA2_SETTINGS = frozenset({"global_layers", "attn_scale_dim", "attn_softcap", "logit_softcap"})
_SOFTCAP_KEYS = frozenset({"attn_logit_softcapping", "final_logit_softcapping"})
_GGUF_TENSORS = {name: keys for name, keys in llama.GGUF_TENSORS.items() if name != "output.weight"}  # tied
_POST_NORMS = {  # Gemma 2/3's norms after each sublayer, before the residual sum (D,)
    "blk.{i}.post_attention_norm.weight": ("layers.{i}.post_attn_norm.weight",),
    "blk.{i}.post_ffw_norm.weight": ("layers.{i}.post_ffn_norm.weight",),
}


def _activation(c: dict[str, Any]) -> None:
    # Gemma's config.json says "gelu" but means the tanh approximation (transformers maps it so).
    activation = c.get("hidden_activation") or c.get("hidden_act", "gelu_pytorch_tanh")
    if activation not in ("gelu", "gelu_pytorch_tanh", "gelu_new"):
        unsupported(c, "hidden_activation" if c.get("hidden_activation") else "hidden_act", activation,
                    "Gemma's MLP is GeGLU with the tanh GELU in handformer")


def _gemma(c: dict[str, Any]) -> CausalLMConfig:
    """Gemma (v1): embeddings times sqrt(d_model), RMSNorm with gain 1 + w, GeGLU with the tanh
    GELU, tied head, head_dim that may differ from hidden_size / num_attention_heads."""
    _activation(c)
    no_attention_bias(c)
    return rope_decoder(c, activation="geglu_tanh", norm="rmsnorm_offset", scale_embeddings=True,
                        tie_embeddings=c.get("tie_word_embeddings", True),
                        max_positions=c.get("max_position_embeddings", 8192))


_GELU = {"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False}
GEMMA = FamilySpec(
    model_type="gemma", name="Gemma", hf_class="GemmaForCausalLM",
    fixed={**GEMMA_BLOCK, "sliding_window": (None, "has no sliding-window attention (Gemma 2 has)")},
    from_hf_config=_gemma, to_hf_config=lambda cfg: {**rope_decoder_keys(cfg), **_GELU},
        tensors=llama.TENSORS,
    gguf=GgufEntry("gemma", "gemma", "Gemma", _GGUF_TENSORS,
                   {**llama.GGUF_BLOCK, **GEMMA_BLOCK,
                    "tie_embeddings": (True, "always ties the output head to the embedding in llama.cpp"),
                    "sliding_window": (None, "has no sliding-window attention (Gemma 2 has)"),
                    "rope_scaling": llama.NO_SCALING_IN_LLAMA_CPP},
                   norm_offset=True, tied_only=True, biases=()),
    gguf_fallback=True, differences=Differences(norm="RMSNorm with gain 1 + w", ffn="GeGLU (tanh GELU)",
                            embedding="times sqrt(d_model); tied head"),
    claims=((70,
        lambda c: c.norm == "rmsnorm_offset" or c.scale_embeddings or c.activation.startswith("geglu")),))


def _layer_types(c: dict[str, Any], pattern: int) -> dict[str, Any]:
    """Older configs have no layer_types: every `pattern`-th layer is global (Gemma 2: 2, Gemma 3: 6)."""
    if c.get("layer_types"):
        return c
    n_layers = require(c, "num_hidden_layers")
    return {**c, "layer_types": ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                 for i in range(n_layers)]}


def _gemma2(c: dict[str, Any]) -> CausalLMConfig:
    """Gemma 2: Gemma's block with norms after each sublayer too, scores scaled by
    query_pre_attn_scalar and soft-capped, logits soft-capped, sliding and global layers."""
    c = _layer_types(c, 2)
    return dataclasses.replace(
        _gemma(c), norm_placement="sandwich", attn_scale_dim=c.get("query_pre_attn_scalar", 256),
        attn_softcap=c.get("attn_logit_softcapping"), logit_softcap=c.get("final_logit_softcapping"),
        **window_settings(c, c.get("sliding_window")))


def _gemma2_keys(cfg: CausalLMConfig, rope_scaling: bool = True) -> dict[str, Any]:
    return {**rope_decoder_keys(cfg, rope_scaling), **_GELU,
        "query_pre_attn_scalar": cfg.family.attn_scale_dim or cfg.head_dim,
            "attn_logit_softcapping": cfg.family.attn_softcap,
            "final_logit_softcapping": cfg.family.logit_softcap,
            "sliding_window": cfg.sliding_window, "layer_types": layer_types_keys(cfg)}


_GEMMA2_GGUF = {**{k: v for k, v in GEMMA.gguf.settings.items() if k != "sliding_window"},  # type: ignore[union-attr]
                "norm_placement": SANDWICH}
_VARIANTS = ("SandwichBlock", "GemmaAttention", "SoftcappedHead")
GEMMA2 = FamilySpec(
    model_type="gemma2", name="Gemma 2", hf_class="Gemma2ForCausalLM", fixed={**GEMMA_BLOCK,
        "norm_placement": SANDWICH},
    from_hf_config=_gemma2, to_hf_config=_gemma2_keys,
    # four norms a block (SandwichBlock); Gemma 3's q/k norms per head
    tensors=llama.llama_like(llama.linears({**llama.ATTENTION, **llama.MLP}), llama.QK_NORMS, llama.norms({
        "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attn_norm",
        "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffn_norm"})),
    gguf=GgufEntry("gemma2", "gemma2", "Gemma 2", {**_GGUF_TENSORS, **_POST_NORMS},
                   {**_GEMMA2_GGUF, "qk_norm": ("none", "has no q/k norms (Gemma 3 has)")},
                   norm_offset=True, tied_only=True, biases=(), swa_pattern=2, softcaps=True,
                       writes=_GEMMA2_SETTINGS),
    may_set=_GEMMA2_SETTINGS, hf_keys=_SOFTCAP_KEYS, layer_types=True,
    claims=((21, lambda c: c.norm_placement == "sandwich"),), variants=_VARIANTS,
    differences=Differences(norm="Gemma's, before and after each sublayer",
                            attention="scores scaled by query_pre_attn_scalar, soft-capped",
                            ffn="GeGLU (tanh GELU)", embedding="as Gemma's; logits soft-capped",
                            cache="sliding and global layers alternate"))


def _gemma3_rope(c: dict[str, Any], window: int | None, global_layers: list[int]) -> dict[str, Any]:
    """rope_theta and rope_scaling of the global layers, rope_local_theta of the sliding ones: from
    rope_parameters per layer type (transformers 5), or rope_theta, rope_scaling and
    rope_local_base_freq (older configs). A model of one kind of layer needs one RoPE."""
    per_type = c.get("rope_parameters") or {}
    if "full_attention" in per_type or "sliding_attention" in per_type:
        theta, scaling = rope_parameters(c, "rope_parameters", per_type.get("full_attention") or {},
                                         ("default", "linear"))
        local, local_scaling = rope_parameters(c, "rope_parameters", per_type.get("sliding_attention") or {},
                                               ("default",))
    else:
        theta, scaling = rope({**c, "rope_parameters": None}, ("default", "linear"))
        local = c.get("rope_local_base_freq", 10000.0)
    theta, local = float(theta or 1e6), float(local or 10000.0)
    if window is None:  # every layer global
        return dict(rope_theta=theta, rope_scaling=scaling)
    if not global_layers:  # every layer slides
        return dict(rope_theta=local, rope_scaling=None)
    return dict(rope_theta=theta, rope_scaling=scaling, rope_local_theta=local)


def _gemma3(c: dict[str, Any]) -> CausalLMConfig:
    """Gemma 3 (text): Gemma 2's block with q/k norms per head and no soft-capping by default; the
    sliding layers (five of every six) with a RoPE base of their own."""
    c = _layer_types(c, c.get("_sliding_window_pattern") or c.get("sliding_window_pattern") or 6)
    windows = window_settings(c, c.get("sliding_window"))
    rope_settings = _gemma3_rope(c, windows["sliding_window"], windows["global_layers"])
    base = _gemma({**c, "rope_parameters": None, "rope_scaling": None})
    return dataclasses.replace(
        base, norm_placement="sandwich", qk_norm="head", attn_scale_dim=c.get("query_pre_attn_scalar", 256),
        attn_softcap=c.get("attn_logit_softcapping"), logit_softcap=c.get("final_logit_softcapping"),
        max_positions=c.get("max_position_embeddings", 131072), **windows, **rope_settings)


def _gemma3_keys(cfg: CausalLMConfig) -> dict[str, Any]:
    """Gemma 2's keys with one RoPE per kind of layer."""
    sliding = {"rope_type": "default", "rope_theta": cfg.family.rope_local_theta or cfg.rope_theta}
    return {**_gemma2_keys(cfg, rope_scaling=False),
            "rope_parameters": {"full_attention": rope_parameters_keys(cfg), "sliding_attention": sliding}}


GEMMA3_TEXT = FamilySpec(
    model_type="gemma3_text", name="Gemma 3", hf_class="Gemma3ForCausalLM",
    fixed={**GEMMA_BLOCK, "norm_placement": SANDWICH, "qk_norm": llama.HEAD_QK_NORM},
    from_hf_config=_gemma3, to_hf_config=_gemma3_keys, tensors=GEMMA2.tensors,
    # llama.cpp fixes the layer pattern (every sixth global), the query scale and the local RoPE base
    gguf=GgufEntry("gemma3", "gemma3_text", "Gemma 3", {**_GGUF_TENSORS, **_POST_NORMS,
        **llama.GGUF_QK_NORMS},
                   {**_GEMMA2_GGUF, "qk_norm": llama.HEAD_QK_NORM},
                   norm_offset=True, tied_only=True, biases=(), swa_pattern=6, local_rope_theta=10000.0,
                   writes=frozenset({"qk_norm", "global_layers", "rope_local_theta", "attn_scale_dim"}),
                   also_recorded=("gemma3",)),
    may_set=_GEMMA2_SETTINGS | {"qk_norm", "rope_local_theta"}, hf_keys=_SOFTCAP_KEYS, layer_types=True,
    rope_scalings=(LinearRopeScaling,), variants=(*_VARIANTS, "LocalGlobalRotary"),
    claims=((20,
        lambda c: c.norm_placement == "sandwich"
        and (c.qk_norm == "head" or bool(c.family.rope_local_theta))),),
    look_alikes={"gemma3": "a Gemma 3 with vision (Gemma3ForConditionalGeneration); handformer imports "
                           "the text "
                           "models (model_type 'gemma3_text': Gemma 3 270M and 1B)"},
    differences=Differences(norm="Gemma's, before and after each sublayer",
                            positions="a RoPE base of their own in the sliding layers",
                            attention="q/k norms per head; scores scaled", ffn="GeGLU (tanh GELU)",
                            embedding="as Gemma's", cache="five sliding layers to one global"))

__all__ = ["GEMMA", "GEMMA2", "GEMMA3_TEXT", "GemmaAttention", "LocalGlobalRotary", "SandwichBlock",
    "SoftcappedHead",
           "fused_scaled_attention", "scaled_attention"]
