"""Typed model configurations, checked on construction, saved and loaded as JSON.

Two families share one set of block settings (`BlockConfig`):
- `Seq2SeqConfig`: the encoder-decoder model of "Attention Is All You Need"; defaults are the
  paper's base model.
- `CausalLMConfig`: the decoder-only language model, with GPT-2 and Llama style presets, and the
  settings of today's families (q/k norms, soft-capping, layers that mix sliding-window and global
  attention, partial and long-context RoPE, mixtures of experts); `handformer.families` builds the
  variants some of them need.

Every invalid value raises `ValueError` naming the field and how to fix it.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import typing
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from handformer.paths import refuse_non_file
from handformer.settings import is_int, is_number

ACTIVATIONS = ("relu", "relu2", "gelu", "gelu_tanh", "swiglu", "geglu", "geglu_tanh", "xielu")
GATED_ACTIVATIONS = ("swiglu", "geglu", "geglu_tanh")
PLAIN_ACTIVATIONS = ("relu", "relu2", "gelu", "gelu_tanh", "xielu")
NORMS = ("layernorm", "rmsnorm", "rmsnorm_offset")
NORM_PLACEMENTS = ("post", "pre")
# The decoder-only model also has Gemma 2/3's norms before and after each sublayer ("sandwich") and
# OLMo 2's norms on each sublayer's output ("reordered"); both are blocks of handformer.families.
CAUSAL_NORM_PLACEMENTS = NORM_PLACEMENTS + ("sandwich", "reordered")
POSITIONS = ("sinusoidal", "learned", "rope", "none")
QK_NORMS = ("none", "head", "width", "head_after_rope")


def _fail(cls_name: str, name: str, value: Any, fix: str) -> None:
    raise ValueError(f"{cls_name}.{name}={value!r} is invalid: {fix}")


def _positive_number(value: Any) -> bool:
    return is_number(value) and value > 0


def _positive_int(value: Any) -> bool:
    return is_int(value) and value > 0


@dataclass
class Llama3RopeScaling:
    """Llama 3.1's frequency-dependent RoPE scaling (rope_type "llama3" in Hugging Face configs).

    Rotary frequencies whose wavelength exceeds original_max_positions / low_freq_factor are divided
    by `factor`, those shorter than original_max_positions / high_freq_factor are kept, and the ones
    in between are interpolated smoothly; see `handformer.nn.positions.llama3_inv_freq`.
    """

    factor: float = 8.0  # how much slower the low frequencies turn
    low_freq_factor: float = 1.0  # wavelengths above original_max_positions / this are scaled
    high_freq_factor: float = 4.0  # wavelengths below original_max_positions / this are kept
    original_max_positions: int = 8192  # the context length the model was pre-trained with
    type: str = "llama3"  # which scaling (saved configs without it are Llama 3's)

    def validate(self, owner: str) -> None:
        name = f"{owner}.rope_scaling"
        for f in ("factor", "low_freq_factor", "high_freq_factor"):
            if not _positive_number(getattr(self, f)):
                _fail(name, f, getattr(self, f), "it must be a number > 0")
        if self.high_freq_factor <= self.low_freq_factor:
            _fail(name, "high_freq_factor", self.high_freq_factor,
                  f"it must be larger than low_freq_factor={self.low_freq_factor}")
        if not _positive_int(self.original_max_positions):
            _fail(name, "original_max_positions", self.original_max_positions,
                  "it must be a positive integer")


@dataclass
class LinearRopeScaling:
    """Position interpolation (rope_type "linear"; Gemma 3's global layers): every rotary frequency
    divided by `factor`, so `factor` times as many positions fit the angles trained on."""

    factor: float = 8.0  # how much slower every frequency turns
    type: str = "linear"

    def validate(self, owner: str) -> None:
        if not _positive_number(self.factor):
            _fail(f"{owner}.rope_scaling", "factor", self.factor, "it must be a number > 0")


@dataclass
class LongRopeScaling:
    """LongRoPE (rope_type "longrope"; Phi-3.5, Phi-4-mini): each rotary frequency divided by a
    factor of its own, one list while the positions stay within original_max_positions, another
    past it, and cos and sin multiplied by attention_factor; see
    `handformer.nn.positions.LongRotaryEmbedding`."""

    short_factor: list[float] = field(default_factory=list)  # one per frequency: within the original context
    long_factor: list[float] = field(default_factory=list)  # one per frequency: past it
    original_max_positions: int = 4096  # the context length the model was pre-trained with
    # cos and sin times this; None: sqrt(1 + ln(s) / ln(original_max_positions)) with s = factor, or
    # max_positions / original_max_positions without one (as transformers)
    attention_factor: float | None = None
    factor: float | None = None
    type: str = "longrope"

    def cos_sin_factor(self, max_positions: int) -> float:
        """What cos and sin are multiplied by: attention_factor, else as transformers computes it."""
        factor = self.factor or max_positions / self.original_max_positions
        if self.attention_factor is not None or factor <= 1.0:
            return self.attention_factor or 1.0
        return math.sqrt(1 + math.log(factor) / math.log(self.original_max_positions))

    def validate(self, owner: str) -> None:
        name = f"{owner}.rope_scaling"
        for f in ("short_factor", "long_factor"):
            values = getattr(self, f)
            if not isinstance(values, list) or not values or not all(_positive_number(v) for v in values):
                _fail(name, f, values, "it must be a non-empty list of numbers > 0, one per rotary frequency")
        if not _positive_int(self.original_max_positions):
            _fail(name, "original_max_positions", self.original_max_positions,
                  "it must be a positive integer")
        for f in ("attention_factor", "factor"):
            if getattr(self, f) is not None and not _positive_number(getattr(self, f)):
                _fail(name, f, getattr(self, f), "it must be a number > 0 or null")


@dataclass
class YarnRopeScaling:
    """YaRN (rope_type "yarn"; gpt-oss, DeepSeek-V3): the frequencies that turn fewer than beta_slow
    times over the original context are divided by `factor`, those that turn more than beta_fast
    times are kept, a linear ramp blends the ones between; cos and sin are multiplied by the
    attention factor. See `handformer.nn.positions.yarn_inv_freq`."""

    factor: float = 32.0  # how much slower the low frequencies turn
    original_max_positions: int = 4096  # the context length the model was pre-trained with
    beta_fast: float = 32.0  # rotations over the original context above which a frequency is kept
    beta_slow: float = 1.0  # rotations below which it is divided by factor
    truncate: bool = True  # the ramp's ends rounded to whole dims (gpt-oss: false)
    # cos and sin times this; None: mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both
    # are set, else mscale(factor) = 0.1 ln(factor) + 1 (as transformers)
    attention_factor: float | None = None
    mscale: float | None = None
    # DeepSeek: the softmax scale also times mscale(factor, mscale_all_dim) squared (its attention's own)
    mscale_all_dim: float | None = None
    type: str = "yarn"

    @staticmethod
    def mscale_of(factor: float, mscale: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0

    def cos_sin_factor(self) -> float:
        """What cos and sin are multiplied by (transformers' attention_factor)."""
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return self.mscale_of(self.factor, self.mscale) / self.mscale_of(self.factor, self.mscale_all_dim)
        return self.mscale_of(self.factor)

    def validate(self, owner: str) -> None:
        name = f"{owner}.rope_scaling"
        for f in ("factor", "beta_fast", "beta_slow"):
            if not _positive_number(getattr(self, f)):
                _fail(name, f, getattr(self, f), "it must be a number > 0")
        if not _positive_int(self.original_max_positions):
            _fail(name, "original_max_positions", self.original_max_positions,
                  "it must be a positive integer")
        if not isinstance(self.truncate, bool):
            _fail(name, "truncate", self.truncate, "it must be true or false")
        if self.attention_factor is not None and not _positive_number(self.attention_factor):
            _fail(name, "attention_factor", self.attention_factor, "it must be a number > 0 or null")
        for f in ("mscale", "mscale_all_dim"):
            if getattr(self, f) is not None and not _positive_number(getattr(self, f)):
                _fail(name, f, getattr(self, f), "it must be a number > 0 or null")


ROPE_SCALINGS = {"llama3": Llama3RopeScaling, "linear": LinearRopeScaling, "longrope": LongRopeScaling,
                 "yarn": YarnRopeScaling}
RopeScaling = Llama3RopeScaling | LinearRopeScaling | LongRopeScaling | YarnRopeScaling


def rope_scaling_from_dict(data: dict[str, Any], section: str) -> RopeScaling:
    """A saved `rope_scaling` table: its "type" picks the class (none given: Llama 3's)."""
    kind = data.get("type", "llama3")
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"[{section}] type={kind!r} is invalid: choose one of {', '.join(ROPE_SCALINGS)}")
    return dataclass_from_dict(ROPE_SCALINGS[kind], data, section)


@dataclass
class MoEConfig:
    """A mixture of experts in place of each block's feed-forward network (Mixtral, Qwen3-MoE): a
    router scores the experts for every token, the token goes through its top_k, and their outputs
    are summed with the router's weights (`handformer.nn.moe`)."""

    n_experts: int = 8  # experts per layer, each a gated feed-forward network
    top_k: int = 2  # experts each token goes through
    d_expert: int | None = None  # hidden width of each expert; None = the model's d_ff
    normalize: bool = True  # the top_k weights rescaled to sum to 1 (Mixtral; Qwen3-MoE's norm_topk_prob)
    # A shared expert of this width that every token goes through, gated by a sigmoid of its own
    # (Qwen2-MoE); 0 = none
    d_shared: int = 0
    # Weight of the load-balancing loss added to the training loss (Switch Transformer, eq. 4)
    aux_loss_coef: float = 0.01
    # DeepSeek-V3's routing (a variant of handformer.families.deepseek): "sigmoid" scores each expert
    # on its own, and a learned correction bias joins the scores when experts are chosen, not their weights
    scoring: str = "softmax"
    n_groups: int = 1  # experts in this many groups; a token's experts come from its top_groups best
    top_groups: int = 1
    routed_scale: float = 1.0  # the routed experts' weights times this (routed_scaling_factor)
    dense_layers: int = 0  # the first layers keep one dense FFN d_ff wide (first_k_dense_replace)
    shared_gate: bool = True  # the shared expert behind a sigmoid gate (Qwen2-MoE); False: added as is

    @property
    def grouped(self) -> bool:
        """Whether the routing or the layers are DeepSeek-V3's (any of the fields above it set)."""
        return (self.scoring, self.n_groups, self.top_groups, self.routed_scale, self.dense_layers,
                self.shared_gate) != ("softmax", 1, 1, 1.0, 0, True)

    def validate(self, owner: str) -> None:
        name = f"{owner}.moe"
        for f in ("n_experts", "top_k"):
            if not _positive_int(getattr(self, f)):
                _fail(name, f, getattr(self, f), "it must be a positive integer")
        if self.top_k > self.n_experts:
            _fail(name, "top_k", self.top_k, f"it must be at most n_experts={self.n_experts}")
        if self.d_expert is not None and not _positive_int(self.d_expert):
            _fail(name, "d_expert", self.d_expert, "it must be a positive integer or null (= d_ff)")
        if not is_int(self.d_shared) or self.d_shared < 0:
            _fail(name, "d_shared", self.d_shared, "it must be an integer >= 0 (0 = no shared expert)")
        if not isinstance(self.normalize, bool):
            _fail(name, "normalize", self.normalize, "it must be true or false")
        value = self.aux_loss_coef
        if not is_number(value) or value < 0:
            _fail(name, "aux_loss_coef", value, "it must be a number >= 0 (0 = no load-balancing loss)")
        self._validate_groups(name)

    def _validate_groups(self, name: str) -> None:
        if self.scoring not in ("softmax", "sigmoid"):
            _fail(name, "scoring", self.scoring, "choose softmax or sigmoid")
        for f in ("n_groups", "top_groups"):
            if not _positive_int(getattr(self, f)):
                _fail(name, f, getattr(self, f), "it must be a positive integer")
        if self.n_experts % self.n_groups or (self.n_groups > 1 and self.n_experts // self.n_groups < 2):
            _fail(name, "n_groups", self.n_groups, f"it must divide n_experts={self.n_experts} into groups "
                  "of at least 2 (a group scores by its best two)")
        if self.top_groups > self.n_groups:
            _fail(name, "top_groups", self.top_groups, f"it must be at most n_groups={self.n_groups}")
        if self.top_k > self.top_groups * self.n_experts // self.n_groups:
            _fail(name, "top_k", self.top_k, "it must be at most the experts of the top_groups groups")
        if not _positive_number(self.routed_scale):
            _fail(name, "routed_scale", self.routed_scale, "it must be a number > 0")
        if not is_int(self.dense_layers) or self.dense_layers < 0:
            _fail(name, "dense_layers", self.dense_layers, "it must be an integer >= 0")
        if not isinstance(self.shared_gate, bool):
            _fail(name, "shared_gate", self.shared_gate, "it must be true or false")


@dataclass
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3, handformer.families.deepseek): keys and values
    come out of one compressed latent per position (kv_rank wide), which is all the KV cache holds
    with one small RoPE key shared by every head. Each query and key head is nope_dim dims without
    RoPE then rope_dim dims with it (rope_dim is the config's head_dim: the rotary tables' width)."""

    kv_rank: int = 512  # width of the key/value latent (kv_lora_rank)
    q_rank: int | None = 1536  # width of the query latent (q_lora_rank); None: queries projected directly
    nope_dim: int = 128  # each query/key head's dims without RoPE (qk_nope_head_dim)
    v_dim: int = 128  # each value head's width (v_head_dim)
    interleave: bool = True  # RoPE turns dims (2j, 2j + 1) together (rope_interleave), not (j, j + Dr/2)

    def validate(self, owner: str) -> None:
        name = f"{owner}.mla"
        for f in ("kv_rank", "nope_dim", "v_dim"):
            if not _positive_int(getattr(self, f)):
                _fail(name, f, getattr(self, f), "it must be a positive integer")
        if self.q_rank is not None and not _positive_int(self.q_rank):
            _fail(name, "q_rank", self.q_rank, "it must be a positive integer or null (no query latent)")
        if not isinstance(self.interleave, bool):
            _fail(name, "interleave", self.interleave, "it must be true or false")


@dataclass
class DeltaNetConfig:
    """Gated DeltaNet linear attention (Yang, Kautz and Hatamizadeh 2024; Qwen3.5's, handformer.families.
    qwen3_5) in place of softmax attention in the listed layers: a recurrent state per value head
    (key_dim x value_dim) that every position decays and writes into by the delta rule, read by
    the queries, after a short causal convolution over the projected queries, keys and values."""

    layers: list[int] = field(default_factory=list)  # the layers that are linear attention
    key_heads: int = 16  # query/key heads (linear_num_key_heads)
    value_heads: int = 32  # value heads, each with its own state (linear_num_value_heads)
    key_dim: int = 128  # width of each query/key head (linear_key_head_dim)
    value_dim: int = 128  # width of each value head (linear_value_head_dim)
    conv_kernel: int = 4  # positions the causal convolution spans (linear_conv_kernel_dim)

    def validate(self, owner: str, n_layers: int) -> None:
        name = f"{owner}.deltanet"
        for f in ("key_heads", "value_heads", "key_dim", "value_dim", "conv_kernel"):
            if not _positive_int(getattr(self, f)):
                _fail(name, f, getattr(self, f), "it must be a positive integer")
        if self.value_heads % self.key_heads:
            _fail(name, "value_heads", self.value_heads,
                  f"it must be a multiple of key_heads={self.key_heads} "
                  "(each query/key head serves value_heads / key_heads value heads)")
        layers = self.layers
        if not (isinstance(layers, list) and all(is_int(i) and 0 <= i < n_layers for i in layers)) \
                or len(set(layers)) != len(layers):
            _fail(name, "layers", layers, f"it must be a list of distinct layer indices 0..{n_layers - 1}")


# The settings only some model families have, each read by that family's variant modules
# (`handformer.families`); saved under a run's "family" section, and accepted flat (as runs saved
# before the section existed hold them) by `CausalLMConfig` and its `from_dict`.
FAMILY_FIELDS = ("rope_local_theta", "nope_layers", "attn_scale_dim", "attn_softcap", "logit_softcap",
                 "attn_sinks", "swiglu_limit", "swiglu_alpha")
_UNSET: Any = object()  # a flat keyword not given (None is a value: "no soft-capping")


@dataclass
class FamilyConfig:
    """What one model family changes in the lesson's decoder-only block, beyond the settings every
    block has. Each field names its family; its default leaves the lesson's block as it is."""

    rope_local_theta: float | None = None  # RoPE base of the sliding layers (Gemma 3); None = rope_theta
    nope_layers: list[int] = field(default_factory=list)  # layers whose attention has no RoPE (SmolLM3)
    # Attention scores divided by sqrt(this) instead of sqrt(head_dim) (Gemma 2/3's query_pre_attn_scalar)
    attn_scale_dim: float | None = None
    attn_softcap: float | None = None  # scores -> c * tanh(scores / c) before the softmax (Gemma 2)
    logit_softcap: float | None = None  # logits -> c * tanh(logits / c) (Gemma 2)
    # Granite's four constants (muP): the embeddings times embedding_multiplier, scores times
    # attention_multiplier (in place of 1/sqrt(head_dim)), each sublayer's output times
    # residual_multiplier before the add, the logits divided by logits_scaling. None: not scaled.
    embedding_multiplier: float | None = None
    attention_multiplier: float | None = None
    residual_multiplier: float | None = None
    logits_scaling: float | None = None
    attn_sinks: bool = False  # a learned logit per head joins each softmax, a key of value zero (gpt-oss)
    # The experts' SwiGLU clamped (gpt-oss): gate <= limit, |up| <= limit, then
    # (up + 1) * gate * sigmoid(swiglu_alpha * gate); None = the lesson's SwiGLU
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702  # the sigmoid's gain in the clamped SwiGLU
    # Attention's output times sigmoid(gate) per head before W_O, the gate projected by W_Q beside
    # each head's query (Qwen3.5)
    attn_output_gate: bool = False
    # Queries times 1 + query_scale_beta * ln(1 + floor(position / query_scale_positions)) after RoPE
    # (Ministral 3's llama_4_scaling_beta over original_max_position_embeddings): a softmax
    # temperature that grows with the position past the original context. None: not scaled.
    query_scale_beta: float | None = None
    query_scale_positions: int | None = None

    def validate(self, owner: str, cfg: CausalLMConfig) -> None:
        """Each field checked, and against the model it belongs to (`cfg`); errors name
        `{owner}.family.<field>`."""
        name = f"{owner}.family"
        layers = self.nope_layers
        indices = isinstance(layers, list) and all(is_int(i) and 0 <= i < cfg.n_layers for i in layers)
        if not indices or len(set(layers)) != len(layers):
            _fail(name, "nope_layers", layers,
                  f"it must be a list of distinct layer indices 0..{cfg.n_layers - 1}")
        if layers and cfg.position != "rope":
            _fail(name, "nope_layers", layers, 'it needs position="rope"')
        for f in ("rope_local_theta", "attn_scale_dim", "attn_softcap", "logit_softcap",
                  "embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"):
            if getattr(self, f) is not None and not _positive_number(getattr(self, f)):
                _fail(name, f, getattr(self, f), "it must be a number > 0 or None")
        gemma3_or_olmo3 = cfg.mixes_windows and cfg.norm_placement in ("sandwich", "reordered")
        if self.rope_local_theta is not None and not gemma3_or_olmo3:
            _fail(name, "rope_local_theta", self.rope_local_theta, "a RoPE base of its own for the sliding "
                  'layers is Gemma 3\'s and OLMo 3\'s: it needs global_layers and norm_placement="sandwich" '
                  'or "reordered"')
        self._validate_gpt_oss(name, cfg)
        if not isinstance(self.attn_output_gate, bool):
            _fail(name, "attn_output_gate", self.attn_output_gate, "it must be true or false")
        self._validate_query_scale(name, cfg)

    def _validate_gpt_oss(self, name: str, cfg: CausalLMConfig) -> None:
        if not isinstance(self.attn_sinks, bool):
            _fail(name, "attn_sinks", self.attn_sinks, "it must be true or false")
        if self.swiglu_limit is not None and not _positive_number(self.swiglu_limit):
            _fail(name, "swiglu_limit", self.swiglu_limit, "it must be a number > 0 or None")
        if not _positive_number(self.swiglu_alpha):
            _fail(name, "swiglu_alpha", self.swiglu_alpha, "it must be a number > 0")
        if self.swiglu_limit is not None and (cfg.moe is None or cfg.activation != "swiglu"):
            _fail(name, "swiglu_limit", self.swiglu_limit, "the clamped SwiGLU is gpt-oss's experts': it "
                  'needs moe and activation="swiglu"')

    def _validate_query_scale(self, name: str, cfg: CausalLMConfig) -> None:
        beta, positions = self.query_scale_beta, self.query_scale_positions
        if beta is not None and not _positive_number(beta):
            _fail(name, "query_scale_beta", beta, "it must be a number > 0 or None")
        if positions is not None and not _positive_int(positions):
            _fail(name, "query_scale_positions", positions, "it must be a positive integer or None")
        if (beta is None) != (positions is None):
            _fail(name, "query_scale_beta" if beta is None else "query_scale_positions", None,
                  "queries scaled by their position need both query_scale_beta and query_scale_positions")
        if beta is not None and cfg.position != "rope":
            _fail(name, "query_scale_beta", beta, 'queries are scaled after RoPE: it needs position="rope"')

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from their defaults (a saved section names only what is used)."""
        default = FamilyConfig()
        return {f.name: dataclasses.asdict(self)[f.name] for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)}


@dataclass
class BlockConfig:
    """Settings shared by every attention block of both model families."""

    d_model: int = 512  # width of the residual stream (the paper's d_model)
    n_heads: int = 8  # attention heads
    n_kv_heads: int | None = None  # key/value heads for grouped-query attention; None = n_heads
    # Width of each head (the paper's d_k). None = d_model // n_heads, filled in on construction;
    # set it where the heads are wider or narrower than that (Gemma 7B: 16 x 256 for d_model 3072).
    head_dim: int | None = None
    d_ff: int = 2048  # hidden width of the position-wise feed-forward network
    dropout: float = 0.1  # on embeddings and on every sublayer output before the residual add
    attention_dropout: float = 0.0  # on the attention weights
    # relu | relu2 (ReLU squared) | gelu | gelu_tanh | swiglu | geglu | geglu_tanh | xielu (Apertus)
    activation: str = "relu"
    norm: str = "layernorm"  # layernorm | rmsnorm | rmsnorm_offset: RMSNorm times (1 + w) (Gemma)
    norm_placement: str = "post"  # post: norm(x + f(x)) as in the paper; pre: x + f(norm(x))
    norm_eps: float = 1e-5  # epsilon inside the norm's square root
    position: str = "sinusoidal"  # sinusoidal | learned | rope | none
    max_positions: int = 512  # longest sequence the position encoding covers
    rope_theta: float = 10000.0  # base of the rotary frequencies (position="rope" only)
    # Long-context scaling of the rotary frequencies: Llama 3.1's, linear (Gemma 3), LongRoPE (Phi-4-mini)
    rope_scaling: RopeScaling | None = None
    bias: bool = True  # biases in every Linear and in LayerNorm
    qkv_bias: bool = False  # biases on the query/key/value projections even when bias=False (Qwen2)
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) as in the paper
    # Queries and keys normalized (with `norm`) before RoPE: none | head: each head on its own
    # (Qwen3, Gemma 3) | width: all heads at once, before the split (OLMo 2) | head_after_rope: each
    # head after RoPE (Hunyuan)
    qk_norm: str = "none"
    rope_fraction: float = 1.0  # the share of each head's dims RoPE turns, the first ones (Phi-4-mini: 0.75)
    moe: MoEConfig | None = None  # a mixture of experts instead of one feed-forward network (Mixtral)

    kind: ClassVar[str] = "block"  # which model a saved config is for ("kind" in its JSON)
    norm_placements: ClassVar[tuple[str, ...]] = NORM_PLACEMENTS
    # Saved configs leave these out while they hold their defaults: a config file names only the
    # settings its model uses (and runs saved before they existed read the same).
    optional_fields: ClassVar[tuple[str, ...]] = ("qk_norm", "rope_fraction", "moe")

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):
            section = f"{type(self).__name__}.rope_scaling"
            self.rope_scaling = rope_scaling_from_dict(self.rope_scaling, section)
        if isinstance(self.moe, dict):
            self.moe = dataclass_from_dict(MoEConfig, self.moe, f"{type(self).__name__}.moe")
        if (self.head_dim is None and isinstance(self.d_model, int) and isinstance(self.n_heads, int)
                and self.n_heads > 0 and self.d_model % self.n_heads == 0):
            self.head_dim = self.d_model // self.n_heads
        self.validate()

    @property
    def derived_head_dim(self) -> bool:
        """True when head_dim is d_model // n_heads (then saved configs leave it out)."""
        return self.head_dim == self.d_model // self.n_heads and self.d_model % self.n_heads == 0

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def rotary_dim(self) -> int:
        """The dims of each head that RoPE turns (all of head_dim unless rope_fraction < 1)."""
        return int(self.head_dim * self.rope_fraction)

    @property
    def head_qk_norm(self) -> str:
        """The norm each query and key head gets inside attention ("none" unless qk_norm="head")."""
        return self.norm if self.qk_norm == "head" else "none"

    def validate(self) -> None:
        name = type(self).__name__
        for f in ("d_model", "n_heads", "d_ff", "max_positions"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                _fail(name, f, value, "it must be a positive integer")
        if self.d_model % self.n_heads and self.head_dim is None:  # with head_dim set, no need (Qwen3.5 27B)
            _fail(name, "d_model", self.d_model,
                  f"it must be divisible by n_heads={self.n_heads} "
                  f"(e.g. d_model={self.n_heads * max(1, self.d_model // self.n_heads)}), or set head_dim")
        if not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool) or self.head_dim <= 0:
            _fail(name, "head_dim", self.head_dim, "it must be a positive integer or None")
        if self.n_kv_heads is not None:
            if (not isinstance(self.n_kv_heads, int) or isinstance(self.n_kv_heads, bool)
                    or self.n_kv_heads <= 0):
                _fail(name, "n_kv_heads", self.n_kv_heads, "it must be a positive integer or None")
            if self.n_heads % self.n_kv_heads:
                _fail(name, "n_kv_heads", self.n_kv_heads,
                      f"n_heads={self.n_heads} must be divisible by it (pick a divisor of n_heads)")
        for f in ("dropout", "attention_dropout"):
            value = getattr(self, f)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                _fail(name, f, value, "it must be a probability in [0, 1)")
        choices = {"activation": ACTIVATIONS, "norm": NORMS, "norm_placement": self.norm_placements,
                   "position": POSITIONS, "qk_norm": QK_NORMS}
        for f, allowed in choices.items():
            if getattr(self, f) not in allowed:
                _fail(name, f, getattr(self, f), f"choose one of {', '.join(allowed)}")
        if not isinstance(self.norm_eps, (int, float)) or self.norm_eps <= 0:
            _fail(name, "norm_eps", self.norm_eps, "it must be a number > 0")
        if self.position == "rope":
            if self.head_dim % 2 and self.derived_head_dim:
                _fail(name, "d_model", self.d_model, f"rotary positions need an even head dim, got "
                      f"d_model / n_heads = {self.head_dim}")
            if self.head_dim % 2:
                _fail(name, "head_dim", self.head_dim, "rotary positions need an even head dim")
            if not isinstance(self.rope_theta, (int, float)) or self.rope_theta <= 0:
                _fail(name, "rope_theta", self.rope_theta, "it must be a number > 0")
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, tuple(ROPE_SCALINGS.values())):
                _fail(name, "rope_scaling", self.rope_scaling,
                      "it must be a Llama3RopeScaling, LinearRopeScaling, LongRopeScaling, YarnRopeScaling "
                      "or None")
            if self.position != "rope":
                _fail(name, "rope_scaling", self.rope_scaling, 'it needs position="rope"')
            self.rope_scaling.validate(name)
        self._validate_rotary_share(name)
        if self.moe is not None:
            if not isinstance(self.moe, MoEConfig):
                _fail(name, "moe", self.moe, "it must be a MoEConfig (n_experts, top_k, ...) or None")
            if self.activation not in GATED_ACTIVATIONS:
                _fail(name, "activation", self.activation, "experts are gated feed-forward networks: "
                      f"choose one of {', '.join(GATED_ACTIVATIONS)} with moe")
            self.moe.validate(name)
        if self.position == "sinusoidal" and self.d_model % 2:
            _fail(name, "d_model", self.d_model, "sinusoidal positions need an even d_model")

    def _validate_rotary_share(self, name: str) -> None:
        """rope_fraction leaves an even number of dims to turn; LongRoPE lists a factor per frequency."""
        value = self.rope_fraction
        if not is_number(value) or not 0 < value <= 1:
            _fail(name, "rope_fraction", value, "it must be a number in (0, 1] (1 = RoPE on every dim)")
        if value != 1 and self.position != "rope":
            _fail(name, "rope_fraction", value, 'it needs position="rope"')
        if self.position == "rope" and (self.rotary_dim < 2 or self.rotary_dim % 2):
            _fail(name, "rope_fraction", value, f"head_dim * rope_fraction = {self.head_dim * value:g} must "
                  "be an even number of dims (at least 2)")
        if isinstance(self.rope_scaling, LongRopeScaling):
            for f in ("short_factor", "long_factor"):
                if len(getattr(self.rope_scaling, f)) != self.rotary_dim // 2:
                    _fail(f"{name}.rope_scaling", f, f"<{len(getattr(self.rope_scaling, f))} numbers>",
                          f"it must hold one factor per rotary frequency: {self.rotary_dim // 2} "
                          f"(head_dim * rope_fraction / 2)")

    # --- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.derived_head_dim:
            data["head_dim"] = None  # derived again on loading, so an edited d_model or n_heads wins
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(self)}
        for name in self.optional_fields:
            if data[name] == defaults[name]:
                del data[name]
        return {"kind": self.kind, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any], section: str | None = None) -> BlockConfig:
        """The config from `to_dict`'s output or a config file's section (named in errors;
        default: the class name)."""
        data = dict(data)
        kind = saved_kind(data, pop=True) or cls.kind
        if kind != cls.kind:
            raise ValueError(f"config is for kind {kind!r}, not {cls.kind!r} ({cls.__name__})")
        return dataclass_from_dict(cls, cls.upgraded(data), section or cls.__name__)

    @classmethod
    def upgraded(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A saved section in the layout of today's fields (configs of every age load the same)."""
        return data

    def save(self, path: str | os.PathLike) -> None:
        from handformer.io import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")


@dataclass
class Seq2SeqConfig(BlockConfig):
    """The encoder-decoder Transformer; defaults are the paper's base model."""

    src_vocab_size: int = 32000  # source vocabulary size
    tgt_vocab_size: int = 32000  # target vocabulary size
    n_encoder_layers: int = 6  # encoder layers (N in the paper)
    n_decoder_layers: int = 6  # decoder layers
    share_embeddings: bool = False  # one embedding table for source and target (same vocab)
    tie_output: bool = True  # the generator reuses the target embedding matrix
    pad_id: int = 0  # padding token id, masked out of attention

    kind: ClassVar[str] = "seq2seq"

    def validate(self) -> None:
        super().validate()
        name = type(self).__name__
        for f in ("src_vocab_size", "tgt_vocab_size", "n_encoder_layers", "n_decoder_layers"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                _fail(name, f, value, "it must be a positive integer")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            _fail(name, "share_embeddings", True,
                  f"shared embeddings need src_vocab_size == tgt_vocab_size "
                  f"({self.src_vocab_size} != {self.tgt_vocab_size}); use a joint vocabulary "
                  "or set share_embeddings=False")
        if not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            _fail(name, "pad_id", self.pad_id, "it must be a valid id in both vocabularies")
        if self.position == "rope":
            _fail(name, "position", self.position, "the encoder-decoder model supports sinusoidal, "
                  "learned or none (rotary positions are for CausalLM)")
        if self.qk_norm in ("width", "head_after_rope"):
            _fail(name, "qk_norm", self.qk_norm, 'the encoder-decoder model supports "none" or "head" '
                  '(OLMo 2\'s norm over all heads and Hunyuan\'s after RoPE are CausalLM variants)')
        if self.moe is not None:
            _fail(name, "moe", self.moe, "mixtures of experts are for CausalLM; leave moe unset")


@dataclass
class CausalLMConfig(BlockConfig):
    """A decoder-only language model. Use `gpt2_style()` or `llama_style()` for the presets."""

    vocab_size: int = 50257  # vocabulary size
    n_layers: int = 12  # decoder-only blocks
    tie_embeddings: bool = True  # the output head reuses the token embedding matrix
    # Sliding-window attention (Mistral): each position sees itself and the sliding_window - 1
    # positions before it, and the KV cache becomes a rolling buffer of that many positions.
    # None = every earlier position.
    sliding_window: int | None = None
    # With a sliding_window: the layers that see every earlier position all the same ("global",
    # Gemma 2: every second layer, Gemma 3: every sixth); the others slide. Empty: all slide.
    global_layers: list[int] = field(default_factory=list)
    # The settings only some families have (soft-capping, a second RoPE base, layers without RoPE...)
    family: FamilyConfig = field(default_factory=FamilyConfig)
    mla: MLAConfig | None = None  # multi-head latent attention instead of q/k/v projections (DeepSeek-V3)
    deltanet: DeltaNetConfig | None = None  # gated DeltaNet linear attention in some layers (Qwen3.5)
    # GPT-2 style by default; see the presets below.
    d_model: int = 768
    n_heads: int = 12
    d_ff: int = 3072
    activation: str = "gelu_tanh"
    norm_placement: str = "pre"
    position: str = "learned"
    max_positions: int = 1024
    scale_embeddings: bool = False
    # The family settings spelled flat, as keywords (`llama_style(attn_softcap=50.0)`, `replace`):
    # each given one moves into `family`; read them back as `cfg.family.<name>` (or `cfg.<name>`).
    rope_local_theta: InitVar[float | None] = _UNSET  # type: ignore[assignment]
    nope_layers: InitVar[list[int]] = _UNSET  # type: ignore[assignment]
    attn_scale_dim: InitVar[float | None] = _UNSET  # type: ignore[assignment]
    attn_softcap: InitVar[float | None] = _UNSET  # type: ignore[assignment]
    logit_softcap: InitVar[float | None] = _UNSET  # type: ignore[assignment]
    attn_sinks: InitVar[bool] = _UNSET  # type: ignore[assignment]
    swiglu_limit: InitVar[float | None] = _UNSET  # type: ignore[assignment]
    swiglu_alpha: InitVar[float] = _UNSET  # type: ignore[assignment]

    kind: ClassVar[str] = "causal_lm"
    norm_placements: ClassVar[tuple[str, ...]] = CAUSAL_NORM_PLACEMENTS
    optional_fields: ClassVar[tuple[str, ...]] = BlockConfig.optional_fields + (
        "global_layers", "mla", "deltanet")

    def __post_init__(self, *flat: Any) -> None:  # type: ignore[override]
        if isinstance(self.family, dict):
            self.family = dataclass_from_dict(FamilyConfig, self.family, f"{type(self).__name__}.family")
        given = {name: value for name, value in zip(FAMILY_FIELDS, flat) if value is not _UNSET}
        if given:
            if not isinstance(self.family, FamilyConfig):
                _fail(type(self).__name__, "family", self.family,
                      "it must be a FamilyConfig or a table of settings")
            self.family = dataclasses.replace(self.family, **given)
        super().__post_init__()

    @classmethod
    def upgraded(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Family settings saved flat (runs written before the "family" section) moved into it."""
        flat = {name: data.pop(name) for name in FAMILY_FIELDS if name in data}
        if flat:
            section = data.get("family", {})
            if not isinstance(section, dict):
                return data  # the section's own check names it
            clash = sorted(name for name in flat if name in section and section[name] != flat[name])
            if clash:
                raise ValueError(f"{clash[0]} is set both flat and in the family section; "
                                 f"keep family.{clash[0]}")
            data["family"] = {**flat, **section}
        return data

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["family"] = self.family.to_dict()
        if not data["family"]:
            del data["family"]  # a model of no family's settings saves none
        return data

    @property
    def mixes_windows(self) -> bool:
        """Whether some layers slide and others are global (one mask and one cache geometry each)."""
        return self.sliding_window is not None and bool(self.global_layers)

    def layer_slides(self, i: int) -> bool:
        """Whether layer i takes the sliding-window mask of a model that mixes the two kinds."""
        return self.mixes_windows and i not in self.global_layers

    def validate(self) -> None:
        super().validate()
        name = type(self).__name__
        for f in ("vocab_size", "n_layers"):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                _fail(name, f, value, "it must be a positive integer")
        window = self.sliding_window
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window <= 0):
            _fail(name, "sliding_window", window, "it must be a positive integer or None")
        layers = self.global_layers
        indices = isinstance(layers, list) and all(is_int(i) and 0 <= i < self.n_layers for i in layers)
        if not indices or len(set(layers)) != len(layers):
            _fail(name, "global_layers", layers,
                  f"it must be a list of distinct layer indices 0..{self.n_layers - 1}")
        if self.global_layers and window is None:
            _fail(name, "global_layers", self.global_layers,
                  "it needs a sliding_window (the window of the other layers)")
        if not isinstance(self.family, FamilyConfig):
            _fail(name, "family", self.family, "it must be a FamilyConfig or a table of settings")
        self.family.validate(name, self)
        self._validate_mla(name)
        self._validate_deltanet(name)

    def _validate_deltanet(self, name: str) -> None:
        if isinstance(self.deltanet, dict):
            self.deltanet = dataclass_from_dict(DeltaNetConfig, self.deltanet, f"{name}.deltanet")
        if self.deltanet is None:
            return
        if not isinstance(self.deltanet, DeltaNetConfig):
            _fail(name, "deltanet", self.deltanet,
                  "it must be a DeltaNetConfig (layers, key_heads, ...) or None")
        self.deltanet.validate(name, self.n_layers)
        if self.sliding_window is not None or self.mla is not None:
            _fail(name, "deltanet", self.deltanet, "linear attention layers go with full softmax attention: "
                  "no sliding_window and no mla")

    @property
    def linear_layers(self) -> frozenset[int]:
        """The layers that are linear attention (gated DeltaNet), whose cache is a state, not keys."""
        return frozenset(self.deltanet.layers) if self.deltanet is not None else frozenset()

    def _validate_mla(self, name: str) -> None:
        if isinstance(self.mla, dict):
            self.mla = dataclass_from_dict(MLAConfig, self.mla, f"{name}.mla")
        if self.mla is None:
            return
        if not isinstance(self.mla, MLAConfig):
            _fail(name, "mla", self.mla, "it must be an MLAConfig (kv_rank, q_rank, ...) or None")
        self.mla.validate(name)
        if self.position != "rope" or self.sliding_window is not None:
            _fail(name, "mla", self.mla, 'latent attention needs position="rope" and no sliding_window')

    def _validate_gpt_oss(self, name: str) -> None:
        if not isinstance(self.attn_sinks, bool):
            _fail(name, "attn_sinks", self.attn_sinks, "it must be true or false")
        for f in ("swiglu_limit", "swiglu_alpha"):
            value = getattr(self, f)
            if not (value is None and f == "swiglu_limit") and not _positive_number(value):
                _fail(name, f, value, "it must be a number > 0" + (" or None" if f == "swiglu_limit" else ""))
        if self.swiglu_limit is not None and (self.moe is None or self.activation != "swiglu"):
            _fail(name, "swiglu_limit", self.swiglu_limit, "the clamped SwiGLU is gpt-oss's experts': it "
                  'needs moe and activation="swiglu"')

    @classmethod
    def gpt2_style(cls, **overrides: Any) -> CausalLMConfig:
        """Learned positions, LayerNorm, GELU (tanh), pre-norm, biases, tied embeddings."""
        preset = dict(position="learned", norm="layernorm", activation="gelu_tanh",
                      norm_placement="pre", bias=True, tie_embeddings=True, norm_eps=1e-5,
                      n_kv_heads=None, scale_embeddings=False)
        return cls(**{**preset, **overrides})

    @classmethod
    def llama_style(cls, **overrides: Any) -> CausalLMConfig:
        """RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied head."""
        preset = dict(position="rope", norm="rmsnorm", activation="swiglu", norm_placement="pre",
                      bias=False, tie_embeddings=False, norm_eps=1e-6, dropout=0.0,
                      scale_embeddings=False, d_model=512, n_heads=8, n_kv_heads=4, d_ff=1376,
                      max_positions=2048)
        return cls(**{**preset, **overrides})


def _flat_reader(name: str) -> property:
    return property(lambda self: getattr(self.family, name), doc=f"family.{name}, read flat")


for _name in FAMILY_FIELDS:  # cfg.attn_softcap reads cfg.family.attn_softcap (the InitVar set it there)
    setattr(CausalLMConfig, _name, _flat_reader(_name))


def setting_name(name: str) -> str:
    """Where a setting lives in a saved config: `family.<name>` for a family setting."""
    return f"family.{name}" if name in _FAMILY_SECTION else name


def setting_value(cfg: CausalLMConfig, name: str) -> Any:
    """A setting of `cfg` by name, a family setting read from its section."""
    return getattr(cfg.family, name) if name in _FAMILY_SECTION else getattr(cfg, name)


_FAMILY_SECTION = frozenset(f.name for f in dataclasses.fields(FamilyConfig))


def saved_kind(data: dict[str, Any], pop: bool = False) -> str | None:
    """Which config class a saved dict is for: its "kind", or the "family" string of configs saved
    before the family section took that name."""
    kind = data.pop("kind", None) if pop else data.get("kind")
    if isinstance(data.get("family"), str):
        old = data.pop("family") if pop else data["family"]
        kind = kind or old
    return kind


CONFIG_CLASSES: dict[str, type[BlockConfig]] = {
    "seq2seq": Seq2SeqConfig,
    "causal_lm": CausalLMConfig,
}


def config_from_dict(data: dict[str, Any]) -> BlockConfig:
    """Build the right config class from a dict carrying a `kind` key ("family" in older files)."""
    kind = saved_kind(data)
    if kind not in CONFIG_CLASSES:
        raise ValueError(f"config 'kind' is {kind!r}; expected one of {', '.join(CONFIG_CLASSES)}")
    return CONFIG_CLASSES[kind].from_dict(data)


def load_config(path: str | os.PathLike) -> BlockConfig:
    """Load a model config saved by `BlockConfig.save`."""
    path = Path(path)
    if not path.is_file():
        refuse_non_file(path, "a config file", "give the config.json a run or `BlockConfig.save` wrote")
        raise FileNotFoundError(f"no config file at {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if isinstance(data, dict) and "model" in data and isinstance(data["model"], dict):
        data = data["model"]  # a run directory's config.json holds model + training sections
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object of model settings, got {type(data).__name__}")
    try:
        return config_from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


__all__ = ["BlockConfig", "Seq2SeqConfig", "CausalLMConfig", "Llama3RopeScaling", "LinearRopeScaling",
           "LongRopeScaling", "MLAConfig", "MoEConfig", "FamilyConfig", "YarnRopeScaling", "load_config",
           "config_from_dict"]


def _close_names(unknown: list[str], known: set[str]) -> str:
    """" (did you mean threads?)": the known names closest to each unknown one (a typo, or `lr` for
    `sft_lr`), or "" where none is close."""
    close = []
    for name in unknown:
        close += difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.75)
        close += [k for k in sorted(known) if k.endswith(f"_{name}") and k not in close]
    return f" (did you mean {', '.join(dict.fromkeys(close))}?)" if close else ""


def dataclass_from_dict(cls: type, data: dict[str, Any], section: str) -> Any:
    """Build dataclass `cls` from a config section, naming any unknown field."""
    if not isinstance(data, dict):
        raise ValueError(f"[{section}] must be a table of settings, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"[{section}] unknown field(s) {', '.join(unknown)}{_close_names(unknown, known)}; "
                         f"valid: {', '.join(sorted(known))}")
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        if name in hints and not _has_type(value, hints[name]):
            raise ValueError(f"[{section}] {name}={value!r} is invalid: it must be {_describe(hints[name])}")
    try:
        return cls(**data)
    except ValueError as err:  # a check in __post_init__ names the class's field: name the section's key
        raise ValueError(_as_section(str(err), cls.__name__, section)) from None


def _as_section(message: str, cls_name: str, section: str) -> str:
    """`message` with the dataclass's names (`TrainConfig.lr=`, `[CausalLMConfig.moe]`) written as
    the config file and --set write them (`[train] lr=`, `[model.moe]`)."""
    if section == cls_name:  # no file section: a config built in Python, named by its class
        return message
    if message.startswith(f"{cls_name}."):
        return f"[{section}] {message[len(cls_name) + 1:]}"
    if message.startswith(f"[{cls_name}."):
        return f"[{section}.{message[len(cls_name) + 2:]}"
    return message


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
               type(None): "null"}


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a value read from JSON or TOML fits a field's annotation (ints count as floats, bools
    count as neither). Annotations other than these simple ones are not checked here."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)):
        return any(_has_type(value, arm) for arm in typing.get_args(hint))
    if origin is list:
        (item,) = typing.get_args(hint) or (Any,)
        return isinstance(value, list) and all(_has_type(v, item) for v in value)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (bool, str, type(None)):
        return isinstance(value, hint)
    return True


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is list:
        return f"a list of {_describe(typing.get_args(hint)[0]).split(' ', 1)[-1]}s"
    if typing.get_args(hint) and origin is not list:
        return " or ".join(_describe(arm) for arm in typing.get_args(hint))
    return _TYPE_WORDS.get(hint, str(hint))
