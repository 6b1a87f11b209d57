"""Import Hugging Face checkpoints into `CausalLM`: GPT-2, Llama, Qwen2, Qwen3, Mistral, Gemma 1/2/3,
SmolLM3, OLMo 2, Phi-3 (Phi-4-mini), and the mixtures of experts Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE.

This is the one place where Hugging Face parameter names meet handformer's plain names. Each
architecture is a declarative map from a Hugging Face key template to handformer key(s), applied
strictly: every checkpoint key is used (only the non-weight buffers listed per architecture are
skipped), every `CausalLM` key is filled, and every shape matches; anything else raises one
`ValueError` that lists all the missing keys, unexpected keys and shape mismatches.

It does not import `transformers`: it works from a config.json dict and a state dict of tensors
(for example read from safetensors files).

    cfg = config_from_hf(json.load(open("config.json")))
    model = CausalLM(cfg)
    load_hf_into(model, safetensors.torch.load_file("model.safetensors"), "gpt2")

Layout notes: GPT-2 stores its Linear layers as `Conv1D` with (in, out) weights, so they are
transposed, and it fuses the query, key and value projections into one `c_attn`, which is split
in q, k, v order. Llama uses half-split RoPE like handformer, so q/k weights load without
permuting. Qwen2, Mistral and Gemma name their tensors as Llama does (the variations are in the
config: see the `_*_config` builders). Phi-3 fuses q, k, v into `qkv_proj` (rows q, then k, then v)
and the SwiGLU's gate and up projections into `gate_up_proj` (rows gate, then up); both are split
at import into handformer's separate projections, so one model class serves every family.
Gemma 2/3 have four norms a block (input, post-attention, pre- and post-feedforward) and OLMo 2 two
after the sublayers (its post_attention_layernorm is handformer's attn_norm, on the attention's
output). A mixture's experts are stored one by one (Mixtral: block_sparse_moe.experts.{e}.w1/w3/w2;
the others mlp.experts.{e}.gate_proj/up_proj/down_proj, the router mlp.gate); transformers 5 stacks
them in memory (`Architecture.in_memory`), which is read as well.
Shape legend: D d_model, H heads, Hkv key/value heads, Dh head dim, F d_ff, V vocab.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.config import (
    CausalLMConfig,
    LinearRopeScaling,
    Llama3RopeScaling,
    LongRopeScaling,
    MoEConfig,
    RopeScaling,
)
from handformer.families import build_causal_lm
from handformer.models.causal_lm import CausalLM


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes. Several keys = split along dim 0 in the listed order,
    with sizes taken from the target shapes. transpose: the source is a Conv1D (in, out) weight."""

    keys: tuple[str, ...]
    transpose: bool = False


def to(*keys: str) -> Target:
    return Target(keys)


def conv1d(*keys: str) -> Target:
    return Target(keys, transpose=True)


@dataclass(frozen=True)
class Architecture:
    model_type: str
    weights: dict[str, Target]  # Hugging Face key template ({i} = layer, {e} = expert) -> handformer key(s)
    ignored: tuple[str, ...]  # key templates of non-weight buffers older checkpoints carry
    base_prefix: str  # prefix of the base model's keys; base-model checkpoints omit it
    embedding: str  # the token embedding's key, which a tied lm_head.weight must equal
    # transformers 5 holds a mixture's experts stacked, (E, ...) per layer, and saves them one by one
    # as checkpoints have them: an in-memory key template -> the checkpoint templates it splits into
    # (each expert's slice split along its dim 0 in the listed order; one template: a rename).
    in_memory: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


HEAD = "lm_head.weight"  # the output head's key, in Hugging Face and in handformer alike

GPT2 = Architecture(
    model_type="gpt2",
    weights={
        "transformer.wte.weight": to("embed.weight"),  # (V, D)
        "transformer.wpe.weight": to("positions.weight"),  # (P, D)
        "transformer.h.{i}.ln_1.weight": to("layers.{i}.attn_norm.weight"),
        "transformer.h.{i}.ln_1.bias": to("layers.{i}.attn_norm.bias"),
        "transformer.h.{i}.attn.c_attn.weight": conv1d(  # (D, 3D) -> 3 x (D, D)
            "layers.{i}.self_attn.q_proj.weight", "layers.{i}.self_attn.k_proj.weight",
            "layers.{i}.self_attn.v_proj.weight"),
        "transformer.h.{i}.attn.c_attn.bias": to(  # (3D,) -> 3 x (D,)
            "layers.{i}.self_attn.q_proj.bias", "layers.{i}.self_attn.k_proj.bias",
            "layers.{i}.self_attn.v_proj.bias"),
        "transformer.h.{i}.attn.c_proj.weight": conv1d("layers.{i}.self_attn.o_proj.weight"),
        "transformer.h.{i}.attn.c_proj.bias": to("layers.{i}.self_attn.o_proj.bias"),
        "transformer.h.{i}.ln_2.weight": to("layers.{i}.ffn_norm.weight"),
        "transformer.h.{i}.ln_2.bias": to("layers.{i}.ffn_norm.bias"),
        "transformer.h.{i}.mlp.c_fc.weight": conv1d("layers.{i}.ffn.up_proj.weight"),  # (D, F)
        "transformer.h.{i}.mlp.c_fc.bias": to("layers.{i}.ffn.up_proj.bias"),
        "transformer.h.{i}.mlp.c_proj.weight": conv1d("layers.{i}.ffn.down_proj.weight"),  # (F, D)
        "transformer.h.{i}.mlp.c_proj.bias": to("layers.{i}.ffn.down_proj.bias"),
        "transformer.ln_f.weight": to("norm.weight"),
        "transformer.ln_f.bias": to("norm.bias"),
        HEAD: to("lm_head.weight"),  # (V, D)
    },
    # The causal mask and the masking value, saved as buffers by older transformers versions.
    ignored=("transformer.h.{i}.attn.bias", "transformer.h.{i}.attn.masked_bias"),
    base_prefix="transformer.",
    embedding="transformer.wte.weight",
)

_LLAMA_LINEARS = {
    "self_attn.q_proj": "self_attn.q_proj",  # (H*Dh, D)
    "self_attn.k_proj": "self_attn.k_proj",  # (Hkv*Dh, D)
    "self_attn.v_proj": "self_attn.v_proj",  # (Hkv*Dh, D)
    "self_attn.o_proj": "self_attn.o_proj",  # (D, H*Dh)
}
_LLAMA_MLP = {
    "mlp.gate_proj": "ffn.gate_proj",  # (F, D)
    "mlp.up_proj": "ffn.up_proj",  # (F, D)
    "mlp.down_proj": "ffn.down_proj",  # (D, F)
}


def _linears(names: dict[str, str]) -> dict[str, Target]:
    """Weight and bias of each linear layer (biases are expected only where the model has them)."""
    return {f"model.layers.{{i}}.{hf}.{p}": to(f"layers.{{i}}.{ours}.{p}") for hf, ours in names.items()
            for p in ("weight", "bias")}


def _norms(names: dict[str, str]) -> dict[str, Target]:
    return {f"model.layers.{{i}}.{hf}.weight": to(f"layers.{{i}}.{ours}.weight")
            for hf, ours in names.items()}


# q/k norms: (Dh,) per head (Qwen3, Gemma 3), (H*Dh,) and (Hkv*Dh,) over the width (OLMo 2, OLMoE).
_QK_NORMS = _norms({"self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm"})
_ENDS = {"model.embed_tokens.weight": to("embed.weight"), "model.norm.weight": to("norm.weight"),
         HEAD: to("lm_head.weight")}
_PRE_NORMS = _norms({"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"})
# RoPE frequencies, recomputed from rope_theta; saved as buffers by older transformers versions.
_ROTARY_BUFFERS = ("model.layers.{i}.self_attn.rotary_emb.inv_freq", "model.rotary_emb.inv_freq")


def _llama_like(model_type: str, *parts: dict[str, Target], **more: Any) -> Architecture:
    weights = {k: v for part in parts for k, v in part.items()}
    return Architecture(model_type, {**_ENDS, **weights}, _ROTARY_BUFFERS, "model.",
                        "model.embed_tokens.weight", **more)


# Llama: q/k norms are mapped too, for the families that have them (Qwen3); a model without them
# has no such keys to fill, so a checkpoint that carries them is refused as unexpected.
LLAMA = _llama_like("llama", _linears({**_LLAMA_LINEARS, **_LLAMA_MLP}), _QK_NORMS, _PRE_NORMS)

PHI3 = _llama_like("phi3", _PRE_NORMS, {
    "model.layers.{i}.self_attn.qkv_proj.weight": to(  # (H*Dh + 2*Hkv*Dh, D) -> q, k, v
        "layers.{i}.self_attn.q_proj.weight", "layers.{i}.self_attn.k_proj.weight",
        "layers.{i}.self_attn.v_proj.weight"),
    "model.layers.{i}.self_attn.o_proj.weight": to("layers.{i}.self_attn.o_proj.weight"),
    "model.layers.{i}.mlp.gate_up_proj.weight": to(  # (2F, D) -> gate (F, D), up (F, D)
        "layers.{i}.ffn.gate_proj.weight", "layers.{i}.ffn.up_proj.weight"),
    "model.layers.{i}.mlp.down_proj.weight": to("layers.{i}.ffn.down_proj.weight"),
})

# Gemma 2/3: four norms a block (SandwichBlock); Gemma 3's q/k norms per head.
GEMMA2 = _llama_like("gemma2", _linears({**_LLAMA_LINEARS, **_LLAMA_MLP}), _QK_NORMS, _norms({
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attn_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffn_norm"}))

# OLMo 2: the norms sit on the sublayers' outputs (ReorderedNormBlock), q/k norms over the width.
OLMO2 = _llama_like("olmo2", _linears({**_LLAMA_LINEARS, **_LLAMA_MLP}), _QK_NORMS, _norms({
    "post_attention_layernorm": "attn_norm", "post_feedforward_layernorm": "ffn_norm"}))

_EXPERT = "layers.{i}.ffn.experts.{e}"
_ROUTER = {"model.layers.{i}.mlp.gate.weight": to("layers.{i}.ffn.router.weight")}  # (E, D)
_EXPERTS = {f"model.layers.{{i}}.mlp.experts.{{e}}.{p}.weight": to(f"{_EXPERT}.{p}.weight")
            for p in ("gate_proj", "up_proj", "down_proj")}  # (F, D), (F, D), (D, F) each
_STACKED_EXPERTS = {  # transformers 5: (E, 2F, D) gate then up, and (E, D, F)
    "model.layers.{i}.mlp.experts.gate_up_proj": ("model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
                                                  "model.layers.{i}.mlp.experts.{e}.up_proj.weight"),
    "model.layers.{i}.mlp.experts.down_proj": ("model.layers.{i}.mlp.experts.{e}.down_proj.weight",)}

QWEN3_MOE = _llama_like("qwen3_moe", _linears(_LLAMA_LINEARS), _QK_NORMS, _PRE_NORMS, _ROUTER, _EXPERTS,
                        in_memory=_STACKED_EXPERTS)
# Qwen2-MoE: a shared expert every token goes through, scaled by a sigmoid gate.
QWEN2_MOE = _llama_like("qwen2_moe", _linears(_LLAMA_LINEARS), _PRE_NORMS, _ROUTER, _EXPERTS, {
    **{f"model.layers.{{i}}.mlp.shared_expert.{p}.weight":
       to(f"layers.{{i}}.ffn.shared_expert.expert.{p}.weight")
       for p in ("gate_proj", "up_proj", "down_proj")},
    "model.layers.{i}.mlp.shared_expert_gate.weight": to("layers.{i}.ffn.shared_expert.gate.weight")},
    in_memory=_STACKED_EXPERTS)
# Mixtral's checkpoints name the mixture block_sparse_moe and the expert matrices w1 (gate), w3
# (up), w2 (down); transformers 5 calls it mlp in memory.
_MIXTRAL = "model.layers.{i}.block_sparse_moe"
MIXTRAL = _llama_like("mixtral", _linears(_LLAMA_LINEARS), _PRE_NORMS, {
    f"{_MIXTRAL}.gate.weight": to("layers.{i}.ffn.router.weight"),
    f"{_MIXTRAL}.experts.{{e}}.w1.weight": to(f"{_EXPERT}.gate_proj.weight"),
    f"{_MIXTRAL}.experts.{{e}}.w3.weight": to(f"{_EXPERT}.up_proj.weight"),
    f"{_MIXTRAL}.experts.{{e}}.w2.weight": to(f"{_EXPERT}.down_proj.weight")},
    in_memory={"model.layers.{i}.mlp.gate.weight": (f"{_MIXTRAL}.gate.weight",),
               "model.layers.{i}.mlp.experts.gate_up_proj": (f"{_MIXTRAL}.experts.{{e}}.w1.weight",
                                                             f"{_MIXTRAL}.experts.{{e}}.w3.weight"),
               "model.layers.{i}.mlp.experts.down_proj": (f"{_MIXTRAL}.experts.{{e}}.w2.weight",)})

# Qwen2, Qwen3, Mistral, Gemma, SmolLM3 checkpoints use Llama's tensor names (Qwen2 adds q/k/v
# biases and Qwen3 q/k norms, which the Llama map covers; Gemma's norm weights are the offsets that
# OffsetRMSNorm stores; SmolLM3's layers without RoPE have no tensors of their own).
ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": GPT2,
    "llama": LLAMA,
    "qwen2": dataclasses.replace(LLAMA, model_type="qwen2"),
    "qwen3": dataclasses.replace(LLAMA, model_type="qwen3"),
    "mistral": dataclasses.replace(LLAMA, model_type="mistral"),
    "gemma": dataclasses.replace(LLAMA, model_type="gemma"),
    "gemma2": GEMMA2,
    "gemma3_text": dataclasses.replace(GEMMA2, model_type="gemma3_text"),
    "smollm3": dataclasses.replace(LLAMA, model_type="smollm3"),
    "olmo2": OLMO2,
    "phi3": PHI3,
    "qwen3_moe": QWEN3_MOE,
    "qwen2_moe": QWEN2_MOE,
    "olmoe": dataclasses.replace(QWEN3_MOE, model_type="olmoe"),
    "mixtral": MIXTRAL,
}


def _architecture(model_type: Any) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise ValueError(f"unsupported model_type {model_type!r}{other_family(model_type)}; "
                         f"supported: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[model_type]


# --- config.json -> CausalLMConfig ----------------------------------------------------------------

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                     "relu": "relu"}


def _require(c: dict[str, Any], key: str) -> Any:
    if c.get(key) is None:
        raise ValueError(f"{c.get('model_type')} config lacks {key!r}, which handformer needs")
    return c[key]


def _unsupported(c: dict[str, Any], key: str, value: Any, why: str) -> None:
    raise ValueError(f"{c.get('model_type')} config has {key}={value!r}: {why}")


def _gpt2_config(c: dict[str, Any]) -> CausalLMConfig:
    activation = c.get("activation_function", "gelu_new")
    if activation not in _GPT2_ACTIVATIONS:
        _unsupported(c, "activation_function", activation,
                     f"handformer supports {', '.join(_GPT2_ACTIVATIONS)}")
    if not c.get("scale_attn_weights", True):
        _unsupported(c, "scale_attn_weights", False, "handformer always scales scores by 1/sqrt(Dh)")
    if c.get("scale_attn_by_inverse_layer_idx", False):
        _unsupported(c, "scale_attn_by_inverse_layer_idx", True, "not implemented in handformer")
    if c.get("add_cross_attention", False):
        _unsupported(c, "add_cross_attention", True, "CausalLM has no cross-attention")
    d_model = _require(c, "n_embd")
    return CausalLMConfig.gpt2_style(
        vocab_size=_require(c, "vocab_size"), d_model=d_model, n_heads=_require(c, "n_head"),
        n_layers=_require(c, "n_layer"), d_ff=c.get("n_inner") or 4 * d_model,
        max_positions=_require(c, "n_positions"), norm_eps=c.get("layer_norm_epsilon", 1e-5),
        activation=_GPT2_ACTIVATIONS[activation], tie_embeddings=c.get("tie_word_embeddings", True),
        dropout=0.0, attention_dropout=0.0)


_MOE_FAMILIES = ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe")
_GEMMAS = ("gemma2", "gemma3_text")

# Settings of model families that handformer implements for some families only (or for none): key
# -> (is the value harmless?, what it asks for, the model_types it is implemented for). Checked for
# every config, before anything else, so a Llama config with soft-capping or experts is refused by
# the key that makes the difference.
_NOT_IMPLEMENTED: dict[str, tuple[Callable[[Any], bool], str, tuple[str, ...]]] = {
    "attn_logit_softcapping": (lambda v: v is None, "soft-capping of attention scores (Gemma 2)", _GEMMAS),
    "final_logit_softcapping": (lambda v: v is None, "soft-capping of the output logits (Gemma 2)", _GEMMAS),
    "use_qk_norm": (lambda v: not v, "normalising queries and keys (q/k norms)", ()),
    "qk_layernorm": (lambda v: not v, "normalising queries and keys (q/k norms)", ()),
    "use_bidirectional_attention": (lambda v: not v, "bidirectional (non-causal) attention", ()),
    "partial_rotary_factor": (lambda v: v in (None, 1, 1.0), "rotary embeddings on part of each head",
                              ("phi3",)),
    "attention_chunk_size": (lambda v: v is None, "chunked attention (Llama 4)", ()),
    "no_rope_layers": (lambda v: not v or all(v), "layers without rotary embeddings", ("smollm3",)),
    "num_local_experts": (lambda v: not v, "mixture-of-experts feed-forward layers", _MOE_FAMILIES),
    "num_experts": (lambda v: not v, "mixture-of-experts feed-forward layers", _MOE_FAMILIES),
    "clip_qkv": (lambda v: v is None, "clipping queries, keys and values", ()),
}

# Families that look close but differ in code, not in a config key.
OTHER_FAMILIES = {
    "gemma3": "a Gemma 3 with vision (Gemma3ForConditionalGeneration); handformer imports the text models "
              "(model_type 'gemma3_text': Gemma 3 270M and 1B)",
    "phi": "Phi-1/2 run attention and the MLP in parallel with LayerNorm and partial rotary embeddings",
    "olmo": "OLMo (1) uses LayerNorm without parameters; OLMo 2 (model_type 'olmo2') is imported",
    "deepseek_v3": "DeepSeek-V3 uses multi-head latent attention",
}

# The families whose Hugging Face model reads `layer_types` (some layers sliding, others global);
# the others apply their sliding_window to every layer.
_LAYER_TYPES = ("qwen2", "qwen3", "qwen2_moe", "smollm3", *_GEMMAS)


def check_implemented(c: dict[str, Any]) -> None:
    """Refuse a config that asks for something handformer does not implement for its family,
    naming the key and its value (see `_NOT_IMPLEMENTED`; also layer kinds a family ignores)."""
    model_type = c.get("model_type")
    for key, (harmless, what, families) in _NOT_IMPLEMENTED.items():
        if key in c and not harmless(c[key]) and model_type not in families:
            where = f" for {model_type} (only for {', '.join(families)})" if families else ""
            _unsupported(c, key, c[key], f"{what} is not implemented in handformer{where}")
    if c.get("use_sliding_window", True):  # the Qwen families ignore their sliding_window without this flag
        _windows(c, c.get("sliding_window"))


def other_family(model_type: Any) -> str:
    """Why a known but unsupported model_type is not imported, as " (...)", or ""."""
    return f" ({OTHER_FAMILIES[model_type]})" if model_type in OTHER_FAMILIES else ""


def _windows(c: dict[str, Any], window: Any) -> tuple[int | None, list[int]]:
    """(sliding_window, global_layers): the window of the sliding layers (None: none slides) and
    the layers that attend to every position. `layer_types` (transformers 5) names each layer's
    kind for the families in _LAYER_TYPES; the others slide every layer, so for them a mix is
    refused."""
    if window is None:
        return None, []
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        _unsupported(c, "sliding_window", window, "it must be a positive integer or null")
    kinds = c.get("layer_types") or ["sliding_attention"] * c.get("num_hidden_layers", 1)
    unknown = sorted(set(kinds) - {"sliding_attention", "full_attention"})
    if unknown:
        _unsupported(c, "layer_types", unknown, "handformer knows sliding_attention and full_attention")
    sliding = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]
    if not sliding:
        return None, []
    if len(sliding) < len(kinds) and c.get("model_type") not in _LAYER_TYPES:
        _unsupported(c, "layer_types", c["layer_types"], "layers that alternate between sliding-window and "
                     f"full attention are read for {', '.join(_LAYER_TYPES)}; this family slides every layer")
    return window, [i for i, kind in enumerate(kinds) if kind == "full_attention"]


def _rope_parameters(c: dict[str, Any], key: str, params: dict[str, Any],
                     allowed: tuple[str, ...]) -> tuple[float | None, RopeScaling | None]:
    """rope_theta and the scaling of one `rope_parameters` / `rope_scaling` table."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in allowed:
        _unsupported(c, key, params, f"rope scaling type {rope_type!r} is not implemented for "
                     f"{c.get('model_type')}; handformer supports {', '.join(repr(t) for t in allowed)} here")
    # As transformers: a top-level original_max_position_embeddings (Phi-3 style) wins.
    original = c.get("original_max_position_embeddings") or params.get(
        "original_max_position_embeddings", c.get("max_position_embeddings"))
    needs = {"llama3": ("factor", "low_freq_factor", "high_freq_factor"), "linear": ("factor",),
             "longrope": ("short_factor", "long_factor")}.get(rope_type, ())
    for needed in needs:
        if needed not in params:
            _unsupported(c, key, params, f"rope_type {rope_type!r} needs {needed!r}")
    scaling: RopeScaling | None = None
    if rope_type == "llama3":
        scaling = Llama3RopeScaling(
            factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]), original_max_positions=original)
    elif rope_type == "linear":
        scaling = LinearRopeScaling(factor=float(params["factor"]))
    elif rope_type == "longrope":
        scaling = LongRopeScaling(
            short_factor=[float(f) for f in params["short_factor"]],
            long_factor=[float(f) for f in params["long_factor"]], original_max_positions=original,
            attention_factor=params.get("attention_factor"), factor=params.get("factor"))
    return params.get("rope_theta"), scaling


def _rope(c: dict[str, Any], allowed: tuple[str, ...] = ("default", "llama3", "linear"),
          ) -> tuple[float, RopeScaling | None]:
    """rope_theta and the scaling, from `rope_parameters` (transformers 5) or the top level with
    `rope_scaling` (older configs); scaling types outside `allowed` are refused."""
    theta, scaling = c.get("rope_theta", 10000.0), None
    for key in ("rope_parameters", "rope_scaling"):
        params = c.get(key) or {}
        found, found_scaling = _rope_parameters(c, key, params, allowed)
        if params.get("partial_rotary_factor", 1.0) != 1.0 and c.get("model_type") != "phi3":
            _unsupported(c, key, params, "partial rotary embeddings are implemented for phi3 only")
        theta, scaling = found or theta, found_scaling or scaling
    return float(theta), scaling


def _rope_decoder(c: dict[str, Any], rope_types: tuple[str, ...] = ("default", "llama3", "linear"),
                  **variation: Any) -> CausalLMConfig:
    """The keys every Llama-like config shares, then the family's `variation` on top."""
    d_model, n_heads = _require(c, "hidden_size"), _require(c, "num_attention_heads")
    theta, scaling = _rope(c, rope_types)
    settings = dict(
        vocab_size=_require(c, "vocab_size"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=c.get("num_key_value_heads") or n_heads, head_dim=c.get("head_dim"),
        n_layers=_require(c, "num_hidden_layers"), d_ff=_require(c, "intermediate_size"),
        max_positions=c.get("max_position_embeddings", 2048), norm_eps=c.get("rms_norm_eps", 1e-6),
        rope_theta=theta, rope_scaling=scaling, tie_embeddings=c.get("tie_word_embeddings", False),
        dropout=0.0, attention_dropout=0.0)
    return CausalLMConfig.llama_style(**{**settings, **variation})


def _silu_only(c: dict[str, Any]) -> None:
    if c.get("hidden_act", "silu") != "silu":
        _unsupported(c, "hidden_act", c["hidden_act"], "this family's MLP is SwiGLU (silu) in handformer")


def _no_attention_bias(c: dict[str, Any]) -> None:
    if c.get("attention_bias", False):
        _unsupported(c, "attention_bias", True,
                     f"{c.get('model_type')} has no attention biases in handformer")


def _window_settings(c: dict[str, Any], window: Any) -> dict[str, Any]:
    sliding_window, global_layers = _windows(c, window)
    return dict(sliding_window=sliding_window, global_layers=global_layers)


def _llama_config(c: dict[str, Any]) -> CausalLMConfig:
    """Llama 2/3.x, and SmolLM/SmolLM2 (tied, 9 query / 3 key-value heads)."""
    _silu_only(c)
    bias = c.get("attention_bias", False)
    if c.get("mlp_bias", False) != bias:
        _unsupported(c, "mlp_bias", c.get("mlp_bias", False), f"handformer has one bias setting; it must "
                     f"equal attention_bias={bias!r}")
    return _rope_decoder(c, bias=bool(bias))


def _qwen_windows(c: dict[str, Any]) -> dict[str, Any]:
    """Qwen's sliding window: only with use_sliding_window, and then on the layers from
    max_window_layers on (layer_types, which transformers 5 writes, says so itself)."""
    window = c.get("sliding_window") if c.get("use_sliding_window", False) else None
    if window is not None and "layer_types" not in c and "max_window_layers" in c:
        first, n_layers = c["max_window_layers"], _require(c, "num_hidden_layers")
        c = {**c, "layer_types": ["sliding_attention" if i >= first else "full_attention"
                                  for i in range(n_layers)]}
    return _window_settings(c, window)


def _qwen2_config(c: dict[str, Any]) -> CausalLMConfig:
    """Qwen2/2.5: biases on q, k, v only; the Qwen sliding window."""
    _silu_only(c)
    return _rope_decoder(c, qkv_bias=True, **_qwen_windows(c))


def _qwen3_config(c: dict[str, Any]) -> CausalLMConfig:
    """Qwen3 (dense): RMSNorm on each query and key head before RoPE, no biases."""
    _silu_only(c)
    _no_attention_bias(c)
    return _rope_decoder(c, qk_norm="head", **_qwen_windows(c))


def _mistral_config(c: dict[str, Any]) -> CausalLMConfig:
    """Mistral: sliding-window attention when sliding_window is set (null: none)."""
    _silu_only(c)
    return _rope_decoder(c, **_window_settings(c, c.get("sliding_window")))


def _smollm3_config(c: dict[str, Any]) -> CausalLMConfig:
    """SmolLM3: Llama's block, tied, without RoPE in the layers no_rope_layers marks 0 (every fourth)."""
    use_rope = c.get("no_rope_layers") or []
    return dataclasses.replace(_llama_config(c), **_qwen_windows(c),
                               nope_layers=[i for i, used in enumerate(use_rope) if not used])


def _phi3_config(c: dict[str, Any]) -> CausalLMConfig:
    """Phi-3, Phi-3.5 and Phi-4-mini: Llama's block with fused projections (split by the weight map),
    rms_norm_eps 1e-5 by default, a sliding window when set; partial RoPE (partial_rotary_factor)
    and LongRoPE scaling."""
    _silu_only(c)
    params = c.get("rope_parameters") or {}
    fraction = params.get("partial_rotary_factor", c.get("partial_rotary_factor")) or 1.0
    return _rope_decoder(c, ("default", "longrope"), norm_eps=c.get("rms_norm_eps", 1e-5),
                         rope_fraction=float(fraction), **_window_settings(c, c.get("sliding_window")))


def _gemma_activation(c: dict[str, Any]) -> None:
    # Gemma's config.json says "gelu" but means the tanh approximation (transformers maps it so).
    activation = c.get("hidden_activation") or c.get("hidden_act", "gelu_pytorch_tanh")
    if activation not in ("gelu", "gelu_pytorch_tanh", "gelu_new"):
        _unsupported(c, "hidden_activation" if c.get("hidden_activation") else "hidden_act", activation,
                     "Gemma's MLP is GeGLU with the tanh GELU in handformer")


def _gemma_config(c: dict[str, Any]) -> CausalLMConfig:
    """Gemma (v1): embeddings times sqrt(d_model), RMSNorm with gain 1 + w, GeGLU with the tanh
    GELU, tied head, head_dim that may differ from hidden_size / num_attention_heads."""
    _gemma_activation(c)
    _no_attention_bias(c)
    return _rope_decoder(c, activation="geglu_tanh", norm="rmsnorm_offset", scale_embeddings=True,
                         tie_embeddings=c.get("tie_word_embeddings", True),
                         max_positions=c.get("max_position_embeddings", 8192))


def _gemma_layer_types(c: dict[str, Any], pattern: int) -> dict[str, Any]:
    """Older configs have no layer_types: every `pattern`-th layer is global (Gemma 2: 2, Gemma 3: 6)."""
    if c.get("layer_types"):
        return c
    n_layers = _require(c, "num_hidden_layers")
    return {**c, "layer_types": ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                 for i in range(n_layers)]}


def _gemma2_config(c: dict[str, Any]) -> CausalLMConfig:
    """Gemma 2: Gemma's block with norms after each sublayer too, scores scaled by
    query_pre_attn_scalar and soft-capped, logits soft-capped, sliding and global layers."""
    c = _gemma_layer_types(c, 2)
    return dataclasses.replace(
        _gemma_config(c), norm_placement="sandwich", attn_scale_dim=c.get("query_pre_attn_scalar", 256),
        attn_softcap=c.get("attn_logit_softcapping"), logit_softcap=c.get("final_logit_softcapping"),
        **_window_settings(c, c.get("sliding_window")))


def _gemma3_rope(c: dict[str, Any], window: int | None, global_layers: list[int]) -> dict[str, Any]:
    """rope_theta and rope_scaling of the global layers, rope_local_theta of the sliding ones: from
    rope_parameters per layer type (transformers 5), or rope_theta, rope_scaling and
    rope_local_base_freq (older configs). A model of one kind of layer needs one RoPE."""
    per_type = c.get("rope_parameters") or {}
    if "full_attention" in per_type or "sliding_attention" in per_type:
        theta, scaling = _rope_parameters(c, "rope_parameters", per_type.get("full_attention") or {},
                                          ("default", "linear"))
        local, local_scaling = _rope_parameters(c, "rope_parameters", per_type.get("sliding_attention") or {},
                                                ("default",))
    else:
        theta, scaling = _rope({**c, "rope_parameters": None}, ("default", "linear"))
        local = c.get("rope_local_base_freq", 10000.0)
    theta, local = float(theta or 1e6), float(local or 10000.0)
    if window is None:  # every layer global
        return dict(rope_theta=theta, rope_scaling=scaling)
    if not global_layers:  # every layer slides
        return dict(rope_theta=local, rope_scaling=None)
    return dict(rope_theta=theta, rope_scaling=scaling, rope_local_theta=local)


def _gemma3_config(c: dict[str, Any]) -> CausalLMConfig:
    """Gemma 3 (text): Gemma 2's block with q/k norms per head and no soft-capping by default; the
    sliding layers (five of every six) with a RoPE base of their own."""
    c = _gemma_layer_types(c, c.get("_sliding_window_pattern") or c.get("sliding_window_pattern") or 6)
    windows = _window_settings(c, c.get("sliding_window"))
    rope = _gemma3_rope(c, windows["sliding_window"], windows["global_layers"])
    base = _gemma_config({**c, "rope_parameters": None, "rope_scaling": None})
    return dataclasses.replace(
        base, norm_placement="sandwich", qk_norm="head", attn_scale_dim=c.get("query_pre_attn_scalar", 256),
        attn_softcap=c.get("attn_logit_softcapping"), logit_softcap=c.get("final_logit_softcapping"),
        max_positions=c.get("max_position_embeddings", 131072), **windows, **rope)


def _olmo2_config(c: dict[str, Any]) -> CausalLMConfig:
    """OLMo 2: norms on each sublayer's output (the reordered norm), q/k norms over the whole width,
    rms_norm_eps 1e-5 by default."""
    _silu_only(c)
    _no_attention_bias(c)
    return _rope_decoder(c, norm_placement="reordered", qk_norm="width", norm_eps=c.get("rms_norm_eps", 1e-5))


def _experts(c: dict[str, Any], d_expert: int | None, normalize: bool, d_shared: int = 0) -> MoEConfig:
    """The mixture of a MoE config: every layer sparse (decoder_sparse_step 1, no mlp_only_layers)."""
    if c.get("decoder_sparse_step", 1) != 1:
        _unsupported(c, "decoder_sparse_step", c["decoder_sparse_step"],
                     "handformer puts a mixture of experts in every layer (decoder_sparse_step 1)")
    if c.get("mlp_only_layers"):
        _unsupported(c, "mlp_only_layers", c["mlp_only_layers"], "dense layers between the "
                     "mixture-of-experts layers are not implemented; every layer is sparse in handformer")
    n_experts = c.get("num_experts") or c.get("num_local_experts")
    return MoEConfig(n_experts=n_experts or _require(c, "num_experts"),
                     top_k=_require(c, "num_experts_per_tok"), d_expert=d_expert,
                     normalize=bool(normalize), d_shared=d_shared,
                     aux_loss_coef=float(c.get("router_aux_loss_coef", 0.001)))


def _mixtral_config(c: dict[str, Any]) -> CausalLMConfig:
    """Mixtral: Mistral's block with a mixture of experts (SwiGLU, intermediate_size wide), top-k
    weights renormalized."""
    _silu_only(c)
    return _rope_decoder(c, moe=_experts(c, None, True),  # the experts are d_ff (intermediate_size) wide
                         norm_eps=c.get("rms_norm_eps", 1e-5), **_window_settings(c, c.get("sliding_window")))


def _qwen3_moe_config(c: dict[str, Any]) -> CausalLMConfig:
    """Qwen3-MoE: Qwen3's attention with a mixture of experts (moe_intermediate_size wide); the top-k
    weights renormalized when norm_topk_prob."""
    _silu_only(c)
    _no_attention_bias(c)
    moe = _experts(c, _require(c, "moe_intermediate_size"), c.get("norm_topk_prob", False))
    window = c.get("sliding_window") if c.get("use_sliding_window", False) else None
    return _rope_decoder(c, qk_norm="head", moe=moe, **_window_settings(c, window))


def _qwen2_moe_config(c: dict[str, Any]) -> CausalLMConfig:
    """Qwen2-MoE: Qwen2's attention (q/k/v biases) with experts and a shared expert behind a sigmoid gate."""
    _silu_only(c)
    moe = _experts(c, _require(c, "moe_intermediate_size"), c.get("norm_topk_prob", False),
                   _require(c, "shared_expert_intermediate_size"))
    return _rope_decoder(c, qkv_bias=True, moe=moe, **_qwen_windows(c))


def _olmoe_config(c: dict[str, Any]) -> CausalLMConfig:
    """OLMoE: pre-norm blocks with q/k norms over the width and a mixture of experts, top-k weights
    not renormalized by default."""
    _silu_only(c)
    _no_attention_bias(c)
    moe = _experts(c, None, c.get("norm_topk_prob", False))  # experts of intermediate_size, the d_ff
    return _rope_decoder(c, qk_norm="width", moe=moe, norm_eps=c.get("rms_norm_eps", 1e-5))


_BUILDERS = {"gpt2": _gpt2_config, "llama": _llama_config, "qwen2": _qwen2_config, "qwen3": _qwen3_config,
             "mistral": _mistral_config, "gemma": _gemma_config, "gemma2": _gemma2_config,
             "gemma3_text": _gemma3_config, "smollm3": _smollm3_config, "olmo2": _olmo2_config,
             "phi3": _phi3_config, "mixtral": _mixtral_config, "qwen3_moe": _qwen3_moe_config,
             "qwen2_moe": _qwen2_moe_config, "olmoe": _olmoe_config}


def config_from_hf(hf_config: dict[str, Any]) -> CausalLMConfig:
    """A `CausalLMConfig` from a Hugging Face config.json dict (model_type one of ARCHITECTURES),
    with dropout 0. Options handformer does not implement raise `ValueError` naming them."""
    check_implemented(hf_config)
    _architecture(hf_config.get("model_type"))
    return _BUILDERS[hf_config["model_type"]](hf_config)


# --- state dict -> CausalLM state dict ------------------------------------------------------------

def _expected_shapes(cfg: CausalLMConfig) -> dict[str, tuple[int, ...]]:
    """Every key of the model's state dict (`build_causal_lm(cfg)`) and its shape, built on the
    meta device (no memory)."""
    with torch.device("meta"):
        model = build_causal_lm(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def instances(template: str, cfg: CausalLMConfig) -> list[dict[str, int | None]]:
    """The {i} (layer) and {e} (expert) values a key template takes in a model of `cfg`."""
    layers = range(cfg.n_layers) if "{i}" in template else [None]
    experts = range(cfg.moe.n_experts if cfg.moe else 0) if "{e}" in template else [None]
    return [{"i": i, "e": e} for i in layers for e in experts]


def _plan(arch: Architecture, cfg: CausalLMConfig, expected: dict[str, tuple[int, ...]]) -> dict[str, Target]:
    """Checkpoint key -> concrete target, for each map entry whose targets the model has."""
    plan = {}
    for template, target in arch.weights.items():
        for at in instances(template, cfg):
            keys = tuple(k.format(**at) for k in target.keys)
            if all(k in expected for k in keys):
                plan[template.format(**at)] = Target(keys, target.transpose)
    return plan


def _unstack(state: dict[str, Tensor], arch: Architecture, cfg: CausalLMConfig) -> dict[str, Tensor]:
    """transformers 5's in-memory names and stacked experts (`Architecture.in_memory`) as the
    checkpoint's: each (E, rows, cols) tensor split into its experts' matrices (views, no copy)."""
    for template, targets in arch.in_memory.items():
        for at in instances(template, cfg):
            key = template.format(**at)
            if key not in state:
                continue
            tensor = state.pop(key)
            if "{e}" not in targets[0]:
                state[targets[0].format(**at)] = tensor
                continue
            for e, expert in enumerate(tensor):  # (rows, cols) each
                for name, part in zip(targets, expert.chunk(len(targets), dim=0)):
                    state[name.format(i=at["i"], e=e)] = part
    return state


def _source_shape(target: Target, expected: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The checkpoint shape the targets need: their shapes stacked along dim 0, transposed for Conv1D."""
    shapes = [expected[k] for k in target.keys]
    shape = (sum(s[0] for s in shapes), *shapes[0][1:])
    return shape[::-1] if target.transpose else shape


def _apply(tensor: Tensor, target: Target, expected: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    """The target tensors, as views of `tensor` (a transposed Conv1D weight is a strided view:
    whoever stores it makes it contiguous, one tensor at a time)."""
    if target.transpose:
        tensor = tensor.t()  # Conv1D (in, out) -> Linear (out, in)
    parts = tensor.split([expected[k][0] for k in target.keys], dim=0)
    return dict(zip(target.keys, parts))


def _with_base_prefix(hf_state: dict[str, Tensor], prefix: str) -> tuple[dict[str, Tensor], str]:
    """Base-model checkpoints (e.g. openai-community/gpt2's model.safetensors) omit the prefix."""
    if any(k.startswith(prefix) for k in hf_state):
        return dict(hf_state), ""
    state = {(k if k == HEAD else prefix + k): v for k, v in hf_state.items()}
    return state, f" (the checkpoint's keys have no {prefix!r} prefix; it is added in these names)"


def _mismatch_error(model_type: str, n_layers: int, problems: dict[str, list[str]], note: str) -> None:
    lines = [f"{title} ({len(items)}): {', '.join(items)}" for title, items in problems.items() if items]
    if lines:
        raise ValueError(f"{model_type} checkpoint does not match CausalLM with {n_layers} layers"
                         f"{note}:\n  " + "\n  ".join(lines))


def convert_hf_state_dict(hf_state: dict[str, Tensor], cfg: CausalLMConfig,
                          model_type: str) -> dict[str, Tensor]:
    """A Hugging Face state dict (GPT-2, Llama, ...) -> a state dict that `CausalLM(cfg)` loads with
    strict=True. Raises `ValueError` listing missing keys, unexpected keys and shape mismatches.

    With tied embeddings the checkpoint may omit lm_head.weight; if present it must equal the
    embedding. The returned tensors may share memory with `hf_state`.
    """
    arch = _architecture(model_type)
    state, note = _with_base_prefix(hf_state, arch.base_prefix)
    state = _unstack(state, arch, cfg)
    expected = _expected_shapes(cfg)
    plan = _plan(arch, cfg, expected)
    tied_head = plan.pop(HEAD) if cfg.tie_embeddings else None
    ignored = [re.compile(re.escape(t).replace(r"\{i\}", r"\d+")) for t in arch.ignored]
    problems: dict[str, list[str]] = {
        "missing keys": [k for k in plan if k not in state],
        "unexpected keys": [k for k in state if k not in plan and not (tied_head and k == HEAD)
                            and not any(p.fullmatch(k) for p in ignored)],
        "shape mismatches": [],
        "CausalLM keys no checkpoint key maps to": sorted(
            set(expected) - {k for t in plan.values() for k in t.keys} - ({HEAD} if tied_head else set())),
    }
    out: dict[str, Tensor] = {}
    for key, target in plan.items():
        if key not in state:
            continue
        shape = _source_shape(target, expected)
        if tuple(state[key].shape) != shape:
            problems["shape mismatches"].append(f"{key}: checkpoint {tuple(state[key].shape)}, "
                                                f"expected {shape} (-> {', '.join(target.keys)})")
        else:
            out.update(_apply(state[key], target, expected))
    _mismatch_error(model_type, cfg.n_layers, problems, note)
    if tied_head is not None:
        if HEAD in state and not torch.equal(state[HEAD], state[arch.embedding]):
            raise ValueError(f"tie_embeddings=True but the checkpoint's {HEAD} differs from "
                             f"{arch.embedding}; set tie_word_embeddings=False in its config")
        out[HEAD] = out[plan[arch.embedding].keys[0]]  # the same tensor, as in the tied model
    return out


def load_hf_into(model: CausalLM, hf_state: dict[str, Tensor], model_type: str) -> None:
    """Load a Hugging Face state dict (model_type one of ARCHITECTURES) into `model` (strictly)."""
    model.load_state_dict(convert_hf_state_dict(hf_state, model.cfg, model_type), strict=True)


def model_from_hf(hf_config: dict[str, Any], hf_state: dict[str, Tensor]) -> CausalLM:
    """A `CausalLM` built from a Hugging Face config.json dict and loaded with its weights."""
    model = build_causal_lm(config_from_hf(hf_config))
    load_hf_into(model, hf_state, hf_config["model_type"])
    return model


__all__ = ["ARCHITECTURES", "Architecture", "Target", "check_implemented", "config_from_hf",
           "convert_hf_state_dict", "load_hf_into", "model_from_hf"]
