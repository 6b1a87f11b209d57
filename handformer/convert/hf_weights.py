"""Import Hugging Face GPT-2, Llama, Qwen2, Mistral, Gemma and Phi-3 checkpoints into `CausalLM`.

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
Shape legend: D d_model, H heads, Hkv key/value heads, Dh head dim, F d_ff, V vocab.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.config import CausalLMConfig, Llama3RopeScaling
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

PHI3 = Architecture(
    model_type="phi3",
    weights={
        "model.embed_tokens.weight": to("embed.weight"),
        "model.layers.{i}.self_attn.qkv_proj.weight": to(  # (H*Dh + 2*Hkv*Dh, D) -> q, k, v
            "layers.{i}.self_attn.q_proj.weight", "layers.{i}.self_attn.k_proj.weight",
            "layers.{i}.self_attn.v_proj.weight"),
        "model.layers.{i}.self_attn.o_proj.weight": to("layers.{i}.self_attn.o_proj.weight"),
        "model.layers.{i}.mlp.gate_up_proj.weight": to(  # (2F, D) -> gate (F, D), up (F, D)
            "layers.{i}.ffn.gate_proj.weight", "layers.{i}.ffn.up_proj.weight"),
        "model.layers.{i}.mlp.down_proj.weight": to("layers.{i}.ffn.down_proj.weight"),
        "model.layers.{i}.input_layernorm.weight": to("layers.{i}.attn_norm.weight"),
        "model.layers.{i}.post_attention_layernorm.weight": to("layers.{i}.ffn_norm.weight"),
        "model.norm.weight": to("norm.weight"),
        HEAD: to("lm_head.weight"),
    },
    ignored=LLAMA.ignored,
    base_prefix="model.",
    embedding="model.embed_tokens.weight",
)

# Qwen2, Mistral and Gemma checkpoints use Llama's tensor names (Qwen2 adds q/k/v biases, which
# the Llama map already covers; Gemma's norm weights are the offsets that OffsetRMSNorm stores).
ARCHITECTURES: dict[str, Architecture] = {
    "gpt2": GPT2,
    "llama": LLAMA,
    "qwen2": dataclasses.replace(LLAMA, model_type="qwen2"),
    "mistral": dataclasses.replace(LLAMA, model_type="mistral"),
    "gemma": dataclasses.replace(LLAMA, model_type="gemma"),
    "phi3": PHI3,
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


# Settings of related model families that handformer does not implement: key -> (is the value
# harmless?, what it would ask for). Checked for every config, before anything else, so a Gemma 2
# or a mixture-of-experts config is refused by the key that makes the difference.
_NOT_IMPLEMENTED: dict[str, tuple[Any, str]] = {
    "attn_logit_softcapping": (lambda v: v is None, "soft-capping of attention scores (Gemma 2)"),
    "final_logit_softcapping": (lambda v: v is None, "soft-capping of the output logits (Gemma 2)"),
    "use_qk_norm": (lambda v: not v, "normalising queries and keys (q/k norms)"),
    "qk_layernorm": (lambda v: not v, "normalising queries and keys (q/k norms)"),
    "use_bidirectional_attention": (lambda v: not v, "bidirectional (non-causal) attention"),
    "partial_rotary_factor": (lambda v: v in (None, 1, 1.0), "rotary embeddings on part of each head"),
    "attention_chunk_size": (lambda v: v is None, "chunked attention (Llama 4)"),
    "no_rope_layers": (lambda v: not v or all(v), "layers without rotary embeddings"),
    "num_local_experts": (lambda v: not v, "mixture-of-experts feed-forward layers"),
    "num_experts": (lambda v: not v, "mixture-of-experts feed-forward layers"),
}

# Families that look close but differ in code, not in a config key.
OTHER_FAMILIES = {
    "qwen3": "Qwen3 normalises queries and keys per head (q_norm, k_norm), which handformer does not "
             "implement",
    "gemma2": "Gemma 2 soft-caps logits and alternates sliding-window and global layers",
    "gemma3": "Gemma 3 normalises queries and keys and alternates sliding-window and global layers",
    "mixtral": "Mixtral's feed-forward layers are a mixture of experts",
    "phi": "Phi-1/2 run attention and the MLP in parallel with LayerNorm and partial rotary embeddings",
}


def check_implemented(c: dict[str, Any]) -> None:
    """Refuse a config that asks for something handformer does not implement, naming the key and
    its value (see `_NOT_IMPLEMENTED`; also layers with different attention windows)."""
    for key, (harmless, what) in _NOT_IMPLEMENTED.items():
        if key in c and not harmless(c[key]):
            _unsupported(c, key, c[key], f"{what} is not implemented in handformer")
    if c.get("use_sliding_window", True):  # Qwen2 ignores its sliding_window without this flag
        _sliding_window(c, c.get("sliding_window"))


def other_family(model_type: Any) -> str:
    """Why a known but unsupported model_type is not imported, as " (...)", or ""."""
    return f" ({OTHER_FAMILIES[model_type]})" if model_type in OTHER_FAMILIES else ""


def _sliding_window(c: dict[str, Any], window: Any) -> int | None:
    """The one attention window all layers use (None: none). `layer_types` (transformers 5) may
    say that only some layers slide: that is refused, handformer has one window for the model."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        _unsupported(c, "sliding_window", window, "it must be a positive integer or null")
    kinds = set(c.get("layer_types") or ["sliding_attention"])
    if kinds == {"full_attention"}:
        return None
    if kinds != {"sliding_attention"}:
        _unsupported(c, "layer_types", c["layer_types"], "layers that alternate between sliding-window "
                     "and full attention are not implemented; handformer has one window for all layers")
    return window


def _rope(c: dict[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    """rope_theta and the scaling, from `rope_parameters` (transformers 5) or the top level with
    `rope_scaling` (older configs). Scaling of type "llama3" is implemented; other types are refused."""
    theta, scaling = c.get("rope_theta", 10000.0), None
    for key in ("rope_parameters", "rope_scaling"):
        params = c.get(key) or {}
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "llama3":
            for needed in ("factor", "low_freq_factor", "high_freq_factor"):
                if needed not in params:
                    _unsupported(c, key, params, f"rope_type 'llama3' needs {needed!r}")
            # As transformers: a top-level original_max_position_embeddings (Phi-3 style) wins.
            original = c.get("original_max_position_embeddings") or params.get(
                "original_max_position_embeddings", c.get("max_position_embeddings"))
            scaling = Llama3RopeScaling(
                factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
                high_freq_factor=float(params["high_freq_factor"]), original_max_positions=original)
        elif rope_type != "default":
            _unsupported(c, key, params, f"rope scaling type {rope_type!r} is not implemented; "
                         "handformer supports plain RoPE (rope_type 'default') and 'llama3'")
        if params.get("partial_rotary_factor", 1.0) != 1.0:
            _unsupported(c, key, params, "partial rotary embeddings are not implemented")
        theta = params.get("rope_theta", theta)
    return float(theta), scaling


def _rope_decoder(c: dict[str, Any], **variation: Any) -> CausalLMConfig:
    """The keys every Llama-like config shares, then the family's `variation` on top."""
    d_model, n_heads = _require(c, "hidden_size"), _require(c, "num_attention_heads")
    theta, scaling = _rope(c)
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


def _llama_config(c: dict[str, Any]) -> CausalLMConfig:
    """Llama 2/3.x, and SmolLM/SmolLM2 (tied, 9 query / 3 key-value heads)."""
    _silu_only(c)
    bias = c.get("attention_bias", False)
    if c.get("mlp_bias", False) != bias:
        _unsupported(c, "mlp_bias", c.get("mlp_bias", False), f"handformer has one bias setting; it must "
                     f"equal attention_bias={bias!r}")
    return _rope_decoder(c, bias=bool(bias))


def _qwen2_config(c: dict[str, Any]) -> CausalLMConfig:
    """Qwen2/2.5: biases on q, k, v only; a sliding window only with use_sliding_window, and then
    on the layers from max_window_layers on (all of them, or none, for handformer)."""
    _silu_only(c)
    window = c.get("sliding_window") if c.get("use_sliding_window", False) else None
    if window is not None and "layer_types" not in c:
        first, n_layers = c.get("max_window_layers", 28), _require(c, "num_hidden_layers")
        c = {**c, "layer_types": ["sliding_attention" if i >= first else "full_attention"
                                  for i in range(n_layers)]}
        if 0 < first < n_layers:
            _unsupported(c, "max_window_layers", first, f"a sliding window on layers {first}.. of "
                         f"{n_layers} only is not implemented; handformer has one window for all layers")
    return _rope_decoder(c, qkv_bias=True, sliding_window=_sliding_window(c, window))


def _mistral_config(c: dict[str, Any]) -> CausalLMConfig:
    """Mistral: sliding-window attention when sliding_window is set (null: none)."""
    _silu_only(c)
    return _rope_decoder(c, sliding_window=_sliding_window(c, c.get("sliding_window")))


def _phi3_config(c: dict[str, Any]) -> CausalLMConfig:
    """Phi-3: Llama's block with fused projections (split by the weight map), untied head,
    rms_norm_eps 1e-5 by default, and a sliding window when set."""
    _silu_only(c)
    return _rope_decoder(c, norm_eps=c.get("rms_norm_eps", 1e-5),
                         sliding_window=_sliding_window(c, c.get("sliding_window")))


def _gemma_config(c: dict[str, Any]) -> CausalLMConfig:
    """Gemma (v1): embeddings times sqrt(d_model), RMSNorm with gain 1 + w, GeGLU with the tanh
    GELU, tied head, head_dim that may differ from hidden_size / num_attention_heads."""
    # Gemma's config.json says "gelu" but means the tanh approximation (transformers maps it so).
    activation = c.get("hidden_activation") or c.get("hidden_act", "gelu_pytorch_tanh")
    if activation not in ("gelu", "gelu_pytorch_tanh", "gelu_new"):
        _unsupported(c, "hidden_activation" if c.get("hidden_activation") else "hidden_act", activation,
                     "Gemma's MLP is GeGLU with the tanh GELU in handformer")
    if c.get("attention_bias", False):
        _unsupported(c, "attention_bias", True, "Gemma has no attention biases in handformer")
    return _rope_decoder(c, activation="geglu_tanh", norm="rmsnorm_offset", scale_embeddings=True,
                         tie_embeddings=c.get("tie_word_embeddings", True),
                         max_positions=c.get("max_position_embeddings", 8192))


def config_from_hf(hf_config: dict[str, Any]) -> CausalLMConfig:
    """A `CausalLMConfig` from a Hugging Face config.json dict (model_type one of ARCHITECTURES),
    with dropout 0. Options handformer does not implement raise `ValueError` naming them."""
    check_implemented(hf_config)
    _architecture(hf_config.get("model_type"))
    builders = {"gpt2": _gpt2_config, "llama": _llama_config, "qwen2": _qwen2_config,
                "mistral": _mistral_config, "gemma": _gemma_config, "phi3": _phi3_config}
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
    """A Hugging Face state dict (GPT-2, Llama, ...) -> a state dict that `CausalLM(cfg)` loads with
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
    """Load a Hugging Face state dict (model_type one of ARCHITECTURES) into `model` (strictly)."""
    model.load_state_dict(convert_hf_state_dict(hf_state, model.cfg, model_type), strict=True)


def model_from_hf(hf_config: dict[str, Any], hf_state: dict[str, Tensor]) -> CausalLM:
    """A `CausalLM` built from a Hugging Face config.json dict and loaded with its weights."""
    model = CausalLM(config_from_hf(hf_config))
    load_hf_into(model, hf_state, hf_config["model_type"])
    return model


__all__ = ["ARCHITECTURES", "Architecture", "Target", "check_implemented", "config_from_hf",
           "convert_hf_state_dict", "load_hf_into", "model_from_hf"]
