"""Import Hugging Face GPT-2 and Llama checkpoints into `CausalLM`.

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
permuting. Shape legend: D d_model, H heads, Hkv key/value heads, Dh head dim, F d_ff, V vocab.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.config import CausalLMConfig
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
    weights: dict[str, Target]  # Hugging Face key template ({i} = layer) -> handformer key(s)
    ignored: tuple[str, ...]  # key templates of non-weight buffers older checkpoints carry
    base_prefix: str  # prefix of the base model's keys; base-model checkpoints omit it
    embedding: str  # the token embedding's key, which a tied lm_head.weight must equal


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
    "mlp.gate_proj": "ffn.gate_proj",  # (F, D)
    "mlp.up_proj": "ffn.up_proj",  # (F, D)
    "mlp.down_proj": "ffn.down_proj",  # (D, F)
}

LLAMA = Architecture(
    model_type="llama",
    weights={
        "model.embed_tokens.weight": to("embed.weight"),
        # Biases exist only with attention_bias / mlp_bias; they are expected when the model has them.
        **{f"model.layers.{{i}}.{hf}.{p}": to(f"layers.{{i}}.{ours}.{p}")
           for hf, ours in _LLAMA_LINEARS.items() for p in ("weight", "bias")},
        "model.layers.{i}.input_layernorm.weight": to("layers.{i}.attn_norm.weight"),
        "model.layers.{i}.post_attention_layernorm.weight": to("layers.{i}.ffn_norm.weight"),
        "model.norm.weight": to("norm.weight"),
        HEAD: to("lm_head.weight"),
    },
    # RoPE frequencies, recomputed from rope_theta; saved as buffers by older transformers versions.
    ignored=("model.layers.{i}.self_attn.rotary_emb.inv_freq", "model.rotary_emb.inv_freq"),
    base_prefix="model.",
    embedding="model.embed_tokens.weight",
)

ARCHITECTURES: dict[str, Architecture] = {"gpt2": GPT2, "llama": LLAMA}


def _architecture(model_type: Any) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(ARCHITECTURES)}")
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


def _rope_theta(c: dict[str, Any]) -> float:
    """rope_theta from `rope_parameters` (transformers 5) or the top level (older configs); any
    rope scaling (`rope_type` / `type` other than "default") is refused."""
    theta = c.get("rope_theta", 10000.0)
    for key in ("rope_parameters", "rope_scaling"):
        params = c.get(key) or {}
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type != "default":
            _unsupported(c, key, params, f"rope scaling type {rope_type!r} is not implemented; "
                         "handformer supports only plain RoPE (rope_type 'default')")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            _unsupported(c, key, params, "partial rotary embeddings are not implemented")
        theta = params.get("rope_theta", theta)
    return float(theta)


def _llama_config(c: dict[str, Any]) -> CausalLMConfig:
    d_model, n_heads = _require(c, "hidden_size"), _require(c, "num_attention_heads")
    head_dim = c.get("head_dim")
    if head_dim is not None and head_dim * n_heads != d_model:
        _unsupported(c, "head_dim", head_dim, f"handformer needs head_dim = hidden_size / "
                     f"num_attention_heads = {d_model / n_heads:g}")
    if c.get("hidden_act", "silu") != "silu":
        _unsupported(c, "hidden_act", c["hidden_act"], "handformer's Llama MLP is SwiGLU (silu)")
    bias = c.get("attention_bias", False)
    if c.get("mlp_bias", False) != bias:
        _unsupported(c, "mlp_bias", c.get("mlp_bias", False), f"handformer has one bias setting; it must "
                     f"equal attention_bias={bias!r}")
    return CausalLMConfig.llama_style(
        vocab_size=_require(c, "vocab_size"), d_model=d_model, n_heads=n_heads,
        n_kv_heads=c.get("num_key_value_heads") or n_heads, n_layers=_require(c, "num_hidden_layers"),
        d_ff=_require(c, "intermediate_size"), max_positions=c.get("max_position_embeddings", 2048),
        norm_eps=c.get("rms_norm_eps", 1e-6), rope_theta=_rope_theta(c), bias=bool(bias),
        tie_embeddings=c.get("tie_word_embeddings", False), dropout=0.0, attention_dropout=0.0)


def config_from_hf(hf_config: dict[str, Any]) -> CausalLMConfig:
    """A `CausalLMConfig` from a Hugging Face config.json dict (model_type "gpt2" or "llama"),
    with dropout 0. Options handformer does not implement raise `ValueError` naming them."""
    builders = {"gpt2": _gpt2_config, "llama": _llama_config}
    _architecture(hf_config.get("model_type"))
    return builders[hf_config["model_type"]](hf_config)


# --- state dict -> CausalLM state dict ------------------------------------------------------------

def _expected_shapes(cfg: CausalLMConfig) -> dict[str, tuple[int, ...]]:
    """Every key of `CausalLM(cfg).state_dict()` and its shape, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = CausalLM(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _plan(arch: Architecture, n_layers: int, expected: dict[str, tuple[int, ...]]) -> dict[str, Target]:
    """Checkpoint key -> concrete target, for each map entry whose targets the model has."""
    plan = {}
    for template, target in arch.weights.items():
        for i in range(n_layers) if "{i}" in template else [None]:
            keys = tuple(k.format(i=i) for k in target.keys)
            if all(k in expected for k in keys):
                plan[template.format(i=i)] = Target(keys, target.transpose)
    return plan


def _source_shape(target: Target, expected: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The checkpoint shape the targets need: their shapes stacked along dim 0, transposed for Conv1D."""
    shapes = [expected[k] for k in target.keys]
    shape = (sum(s[0] for s in shapes), *shapes[0][1:])
    return shape[::-1] if target.transpose else shape


def _apply(tensor: Tensor, target: Target, expected: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    if target.transpose:
        tensor = tensor.t().contiguous()  # Conv1D (in, out) -> Linear (out, in)
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
    """A Hugging Face GPT-2 / Llama state dict -> a state dict that `CausalLM(cfg)` loads with
    strict=True. Raises `ValueError` listing missing keys, unexpected keys and shape mismatches.

    With tied embeddings the checkpoint may omit lm_head.weight; if present it must equal the
    embedding. The returned tensors may share memory with `hf_state`.
    """
    arch = _architecture(model_type)
    state, note = _with_base_prefix(hf_state, arch.base_prefix)
    expected = _expected_shapes(cfg)
    plan = _plan(arch, cfg.n_layers, expected)
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
    """Load a Hugging Face GPT-2 / Llama state dict into `model` (strictly, see above)."""
    model.load_state_dict(convert_hf_state_dict(hf_state, model.cfg, model_type), strict=True)


def model_from_hf(hf_config: dict[str, Any], hf_state: dict[str, Tensor]) -> CausalLM:
    """A `CausalLM` built from a Hugging Face config.json dict and loaded with its weights."""
    model = CausalLM(config_from_hf(hf_config))
    load_hf_into(model, hf_state, hf_config["model_type"])
    return model


__all__ = ["ARCHITECTURES", "Architecture", "Target", "config_from_hf", "convert_hf_state_dict",
           "load_hf_into", "model_from_hf"]
