"""Export a language-model run as a Hugging Face `transformers` directory: the inverse of `hf_import`.

    export_hf("runs/shakespeare_char", "hf/shakespeare_char")
    # then: AutoModelForCausalLM.from_pretrained("hf/shakespeare_char")

The directory holds config.json, model.safetensors, tokenizer.json (+ tokenizer_config.json, so
`PreTrainedTokenizerFast` / `AutoTokenizer` load it) and generation_config.json.

Which architecture (a model_type `import-hf` reads, so import(export(run)) is the run again):
- an imported run goes back to the model_type recorded at import; a fine-tuned or merged run to its
  base run's (followed through "init_from" / "merged_from" while the base run is there);
- any other run (trained here, imported from llama2.c) goes where its settings point: learned
  positions to GPT-2; a mixture of experts to Qwen2-MoE (a shared expert), Qwen3-MoE (q/k norms per
  head), OLMoE (q/k norms over the width) or Mixtral; Gemma 2's block to Gemma 3 (with q/k norms)
  or Gemma 2; OLMo 2's to OLMo 2; layers without RoPE to SmolLM3; partial RoPE or LongRoPE to
  Phi-3; q/k norms to Qwen3; RoPE to Gemma with Gemma's norm, GeGLU and scaled embeddings, to
  Qwen2 with biases on q/k/v only, to Mistral with a sliding window, else to Llama (GQA, tied or
  untied head, rope_theta and Llama 3 rope scaling as set).
Every setting must then match that architecture (`_FIXED`); one `ValueError` names each setting that
does not and what the architecture has instead.

The weights go through the same declarative map the import uses (`hf_weights.ARCHITECTURES`), read
backwards: split projections are concatenated in the listed order (GPT-2's c_attn, Phi-3's qkv_proj
and gate_up_proj), GPT-2's Conv1D weights are transposed back to (in, out). A GPT-2-style run
without some biases (bias=false, the baby GPT) is exported with zero biases: the same function.
No `transformers` import is needed to write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from handformer.config import CausalLMConfig, LinearRopeScaling, Llama3RopeScaling, LongRopeScaling
from handformer.convert.hf_import import ARCHITECTURES as HF_CLASSES
from handformer.convert.hf_weights import ARCHITECTURES, HEAD, instances

_GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
_NAMES = {"gpt2": "GPT-2", "llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral",
          "gemma": "Gemma", "gemma2": "Gemma 2", "gemma3_text": "Gemma 3", "smollm3": "SmolLM3",
          "olmo2": "OLMo 2", "phi3": "Phi-3", "mixtral": "Mixtral", "qwen3_moe": "Qwen3-MoE",
          "qwen2_moe": "Qwen2-MoE", "olmoe": "OLMoE"}
_NO_BIASES = {"bias": (False, "has no biases"), "qkv_bias": (False, "has no biases")}
_LLAMA_BLOCK = {"norm": ("rmsnorm", "uses RMSNorm"), "activation": ("swiglu", "has a SwiGLU MLP"),
                "scale_embeddings": (False, "does not scale embeddings by sqrt(d_model)")}
_GEMMA_BLOCK = {"norm": ("rmsnorm_offset", "has RMSNorm with gain 1 + w"),
                "activation": ("geglu_tanh", "has a GeGLU MLP with the tanh GELU"),
                "scale_embeddings": (True, "scales embeddings by sqrt(d_model)"), **_NO_BIASES}
_NO_WINDOW = {"sliding_window": (None, "has no sliding-window attention")}
_SANDWICH = ("sandwich", "has norms before and after each sublayer")
# model_type -> the settings its architecture fixes: name -> (value, why), checked on every export.
_FIXED: dict[str, dict[str, tuple[Any, str]]] = {
    "gpt2": {"norm": ("layernorm", "uses LayerNorm"),
             "scale_embeddings": (False, "does not scale embeddings by sqrt(d_model)"),
             "sliding_window": (None, "has no sliding-window attention"),
             "n_kv_heads": (None, "has one key/value head per query head")},
    "llama": {**_LLAMA_BLOCK, "sliding_window": (None, "has no sliding-window attention (Mistral has)")},
    "qwen2": {**_LLAMA_BLOCK, "bias": (False, "has biases on q/k/v only"),
              "qkv_bias": (True, "always has q/k/v biases")},
    "qwen3": {**_LLAMA_BLOCK, **_NO_BIASES, "qk_norm": ("head", "normalizes each query and key head")},
    "mistral": {**_LLAMA_BLOCK, **_NO_BIASES},
    "gemma": {**_GEMMA_BLOCK, "sliding_window": (None, "has no sliding-window attention (Gemma 2 has)")},
    "gemma2": {**_GEMMA_BLOCK, "norm_placement": _SANDWICH},
    "gemma3_text": {**_GEMMA_BLOCK, "norm_placement": _SANDWICH,
                    "qk_norm": ("head", "normalizes each query and key head")},
    "smollm3": _LLAMA_BLOCK,
    "olmo2": {**_LLAMA_BLOCK, **_NO_BIASES, **_NO_WINDOW,
              "norm_placement": ("reordered", "norms the sublayers' outputs"),
              "qk_norm": ("width", "normalizes queries and keys over their whole width")},
    "phi3": {**_LLAMA_BLOCK, **_NO_BIASES},
    "mixtral": {**_LLAMA_BLOCK, **_NO_BIASES},
    "qwen3_moe": {**_LLAMA_BLOCK, **_NO_BIASES, "qk_norm": ("head", "normalizes each query and key head")},
    "qwen2_moe": {**_LLAMA_BLOCK, "bias": (False, "has biases on q/k/v only"),
                  "qkv_bias": (True, "always has q/k/v biases")},
    "olmoe": {**_LLAMA_BLOCK, **_NO_BIASES, **_NO_WINDOW,
              "qk_norm": ("width", "normalizes queries and keys over their whole width")},
}
_MOE = ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe")
_LAYER_KINDS = ("qwen2", "qwen3", "qwen2_moe", "smollm3", "gemma2", "gemma3_text")
# The settings of today's families: name -> (its value in a model without it, the families that
# may set it, what it is). A run recorded as another family is refused by the setting's name.
_FAMILY_SETTINGS: dict[str, tuple[Any, tuple[str, ...], str]] = {
    "qk_norm": ("none", ("qwen3", "gemma3_text", "olmo2", "qwen3_moe", "olmoe"), "q/k norms"),
    "moe": (None, _MOE, "experts"),
    "rope_fraction": (1.0, ("phi3",), "partial rotary embeddings"),
    "global_layers": ([], _LAYER_KINDS, "global layers beside sliding-window ones"),
    "nope_layers": ([], ("smollm3",), "layers without RoPE"),
    "rope_local_theta": (None, ("gemma3_text",), "a RoPE base of the sliding layers"),
    "attn_scale_dim": (None, ("gemma2", "gemma3_text"), "a query scale of its own"),
    "attn_softcap": (None, ("gemma2", "gemma3_text"), "soft-capped attention scores"),
    "logit_softcap": (None, ("gemma2", "gemma3_text"), "soft-capped logits"),
}


# --- which architecture, and whether every setting maps --------------------------------------------

def hf_mismatches(cfg: CausalLMConfig, model_type: str) -> list[str]:
    """The settings of `cfg` that `model_type` cannot express, each with what it would need."""
    family, position = _NAMES[model_type], "learned" if model_type == "gpt2" else "rope"
    fixed = {"norm_placement": ("pre", "is pre-norm"),
             "position": (position, f"has {position} positions"), **_FIXED[model_type]}
    if model_type == "gpt2" and cfg.n_kv_heads == cfg.n_heads:
        fixed.pop("n_kv_heads")  # stated, but the same as None
    problems = [f"{name}={getattr(cfg, name)!r} ({family} {why})" for name, (value, why) in fixed.items()
                if getattr(cfg, name) != value]
    problems += [f"{name}={getattr(cfg, name)!r} ({family} has no {what})"
                 for name, (default, families, what) in _FAMILY_SETTINGS.items()
                 if model_type not in families and getattr(cfg, name) != default]
    problems += _scaling_and_experts(cfg, model_type, family)
    if model_type == "gpt2" and cfg.activation not in _GPT2_ACTIVATIONS:
        problems.append(f"activation={cfg.activation!r} (GPT-2 supports {', '.join(_GPT2_ACTIVATIONS)})")
    if model_type == "gpt2" and not cfg.derived_head_dim:
        problems.append(f"head_dim={cfg.head_dim} (GPT-2's heads are d_model / n_heads wide)")
    if model_type == "llama" and cfg.qkv_bias and not cfg.bias:
        problems.append("qkv_bias=True with bias=False (Llama's attention_bias also covers o_proj; "
                        "Qwen2 has q/k/v biases only)")
    return problems


def _scaling_and_experts(cfg: CausalLMConfig, model_type: str, family: str) -> list[str]:
    """What a family's RoPE scaling and mixture of experts must be."""
    problems, scaling, moe = [], cfg.rope_scaling, cfg.moe
    allowed = {"phi3": (LongRopeScaling,), "gemma3_text": (LinearRopeScaling,)}.get(
        model_type, (Llama3RopeScaling, LinearRopeScaling))
    if scaling is not None and not isinstance(scaling, allowed):
        what = " or ".join(f"'{c().type}'" for c in allowed)
        problems.append(f"rope_scaling={scaling!r} ({family} takes only {what} scaling in transformers)")
    if model_type in _MOE and moe is None:
        problems.append(f"moe=None ({family} is a mixture of experts)")
    if moe is not None and model_type in _MOE:
        if (moe.d_shared > 0) != (model_type == "qwen2_moe"):
            problems.append(f"moe.d_shared={moe.d_shared} ({family} "
                            f"{'has' if model_type == 'qwen2_moe' else 'has no'} shared expert)")
        if model_type == "mixtral" and not moe.normalize:
            problems.append("moe.normalize=False (Mixtral always renormalizes the top-k weights)")
    return problems


def model_type_for(cfg: CausalLMConfig) -> str:
    """Where a run's settings point (see the module docstring)."""
    if cfg.position == "learned":
        return "gpt2"
    if cfg.position != "rope":
        raise ValueError(f"position={cfg.position!r} maps to no Hugging Face architecture export-hf "
                         "writes: GPT-2 needs position='learned', the Llama family position='rope'")
    if cfg.moe is not None:
        if cfg.moe.d_shared:
            return "qwen2_moe"
        return {"head": "qwen3_moe", "width": "olmoe"}.get(cfg.qk_norm, "mixtral")
    if cfg.norm_placement == "sandwich":
        return "gemma3_text" if cfg.qk_norm == "head" or cfg.rope_local_theta else "gemma2"
    if cfg.norm_placement == "reordered" or cfg.qk_norm == "width":
        return "olmo2"
    if cfg.nope_layers:
        return "smollm3"
    if cfg.rope_fraction != 1 or isinstance(cfg.rope_scaling, LongRopeScaling):
        return "phi3"
    if cfg.qk_norm == "head":
        return "qwen3"
    if cfg.norm == "rmsnorm_offset" or cfg.scale_embeddings or cfg.activation.startswith("geglu"):
        return "gemma"
    if cfg.qkv_bias and not cfg.bias:
        return "qwen2"
    if cfg.global_layers:
        return "smollm3"  # Llama's block whose layer_types mix sliding and global layers
    return "mistral" if cfg.sliding_window is not None else "llama"


# --- config.json -----------------------------------------------------------------------------------

def _rope_parameters(cfg: CausalLMConfig) -> dict[str, Any]:
    """transformers 5's rope_parameters (the older rope_scaling keys, as import reads them)."""
    s = cfg.rope_scaling
    if s is None:
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if isinstance(s, LinearRopeScaling):
        return {"rope_type": "linear", "rope_theta": cfg.rope_theta, "factor": s.factor}
    if isinstance(s, LongRopeScaling):
        optional = {k: getattr(s, k) for k in ("factor", "attention_factor") if getattr(s, k) is not None}
        return {"rope_type": "longrope", "rope_theta": cfg.rope_theta, "short_factor": s.short_factor,
                "long_factor": s.long_factor, "original_max_position_embeddings": s.original_max_positions,
                **optional}
    return {"rope_type": "llama3", "rope_theta": cfg.rope_theta, "factor": s.factor,
            "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_positions}


def _layer_types(cfg: CausalLMConfig) -> list[str]:
    window = cfg.sliding_window
    return ["full_attention" if window is None or i in cfg.global_layers else "sliding_attention"
            for i in range(cfg.n_layers)]


def _qwen_windows(cfg: CausalLMConfig) -> dict[str, Any]:
    """Qwen's sliding window: use_sliding_window, and layer_types naming each layer's kind
    (max_window_layers: the first sliding layer, for readers of the older key)."""
    kinds = _layer_types(cfg)
    first = kinds.index("sliding_attention") if "sliding_attention" in kinds else cfg.n_layers
    return {"use_sliding_window": cfg.sliding_window is not None, "sliding_window": cfg.sliding_window,
            "max_window_layers": first, "layer_types": kinds}


def _experts(cfg: CausalLMConfig, **names: str) -> dict[str, Any]:
    m = cfg.moe
    return {names.get("n", "num_experts"): m.n_experts, "num_experts_per_tok": m.top_k,
            "router_aux_loss_coef": m.aux_loss_coef, "output_router_logits": False}


def _gemma2_keys(cfg: CausalLMConfig) -> dict[str, Any]:
    return {"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
            "attention_bias": False, "query_pre_attn_scalar": cfg.attn_scale_dim or cfg.head_dim,
            "attn_logit_softcapping": cfg.attn_softcap, "final_logit_softcapping": cfg.logit_softcap,
            "sliding_window": cfg.sliding_window, "layer_types": _layer_types(cfg)}


def _family_config(cfg: CausalLMConfig, model_type: str) -> dict[str, Any]:
    """The keys that set one Llama-like family apart."""
    window, expert_width = cfg.sliding_window, cfg.moe and (cfg.moe.d_expert or cfg.d_ff)
    if model_type == "llama":
        return {"attention_bias": cfg.bias, "mlp_bias": cfg.bias}
    if model_type in ("qwen2", "qwen3"):  # Qwen3: attention_bias False (checked)
        return {**_qwen_windows(cfg), "attention_bias": False}
    if model_type == "mistral":
        return {"sliding_window": window}
    if model_type == "gemma":
        return {"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
                "attention_bias": False}
    if model_type == "gemma2":
        return _gemma2_keys(cfg)
    if model_type == "gemma3_text":  # one RoPE per kind of layer
        sliding = {"rope_type": "default", "rope_theta": cfg.rope_local_theta or cfg.rope_theta}
        return {**_gemma2_keys(cfg), "rope_parameters": {"full_attention": _rope_parameters(cfg),
                                                         "sliding_attention": sliding}}
    if model_type == "smollm3":
        return {**_qwen_windows(cfg), "attention_bias": cfg.bias, "mlp_bias": cfg.bias,
                "no_rope_layers": [0 if i in cfg.nope_layers else 1 for i in range(cfg.n_layers)]}
    if model_type == "olmo2":
        return {"attention_bias": False}
    if model_type == "mixtral":
        return {**_experts(cfg, n="num_local_experts"), "intermediate_size": expert_width,
                "sliding_window": window, "router_jitter_noise": 0.0}
    if model_type in ("qwen3_moe", "qwen2_moe"):
        shared = {"shared_expert_intermediate_size": cfg.moe.d_shared, "qkv_bias": True, **_qwen_windows(cfg)}
        if model_type == "qwen3_moe":
            shared = {"use_sliding_window": window is not None, "sliding_window": window,
                      "attention_bias": False}
        return {**_experts(cfg), "moe_intermediate_size": expert_width, "norm_topk_prob": cfg.moe.normalize,
                "decoder_sparse_step": 1, "mlp_only_layers": [], **shared}
    if model_type == "olmoe":
        return {**_experts(cfg), "intermediate_size": expert_width, "norm_topk_prob": cfg.moe.normalize,
                "clip_qkv": None, "attention_bias": False}
    original = cfg.rope_scaling.original_max_positions if cfg.rope_scaling else cfg.max_positions
    # phi3: its config defaults original_max_position_embeddings to 4096 (import reads it first)
    return {"sliding_window": window, "original_max_position_embeddings": original,
            "partial_rotary_factor": cfg.rope_fraction, "resid_pdrop": 0.0, "embd_pdrop": 0.0}


def hf_config(cfg: CausalLMConfig, model_type: str, token_ids: dict[str, Any]) -> dict[str, Any]:
    """config.json for `cfg` as a Hugging Face `model_type` model."""
    common = {"architectures": [HF_CLASSES[model_type]], "model_type": model_type,
              "vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tie_embeddings,
              "dtype": "float32", **token_ids}
    if model_type == "gpt2":
        return {**common, "n_embd": cfg.d_model, "n_head": cfg.n_heads, "n_layer": cfg.n_layers,
                "n_inner": cfg.d_ff, "n_positions": cfg.max_positions,
                "layer_norm_epsilon": cfg.norm_eps, "activation_function": _GPT2_ACTIVATIONS[cfg.activation],
                "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.attention_dropout,
                "scale_attn_weights": True}
    return {**common, "hidden_size": cfg.d_model, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.kv_heads, "num_hidden_layers": cfg.n_layers,
            "intermediate_size": cfg.d_ff, "max_position_embeddings": cfg.max_positions,
            "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu", "attention_dropout": cfg.attention_dropout,
            "head_dim": cfg.head_dim, "rope_theta": cfg.rope_theta, "rope_parameters": _rope_parameters(cfg),
            # transformers 4 reads the scaling from rope_scaling (5 takes either; import reads both)
            **({"rope_scaling": _rope_parameters(cfg)} if cfg.rope_scaling and model_type != "gemma3_text"
               else {}),
            **_family_config(cfg, model_type)}


# --- weights ---------------------------------------------------------------------------------------

def export_state_dict(state: dict[str, Tensor], cfg: CausalLMConfig, model_type: str) -> dict[str, Tensor]:
    """`CausalLM(cfg).state_dict()` -> the Hugging Face checkpoint's tensors (contiguous, own memory).
    Missing GPT-2 biases (bias=false) become zeros; a tied head is left out, as save_pretrained does.
    Shapes: GPT-2 c_attn (D, 3D) from q/k/v (D, D) each, Conv1D weights (in, out); Phi-3 qkv_proj
    (H*Dh + 2*Hkv*Dh, D), gate_up_proj (2F, D); the others as stored."""
    arch = ARCHITECTURES[model_type]
    out: dict[str, Tensor] = {}
    for template, target in arch.weights.items():
        if template == HEAD and cfg.tie_embeddings:
            continue
        for at in instances(template, cfg):
            keys = [k.format(**at) for k in target.keys]
            if all(k in state for k in keys):
                tensor = torch.cat([state[k] for k in keys], dim=0)  # split projections, rejoined
                out[template.format(**at)] = (tensor.t() if target.transpose else tensor).contiguous()
            elif model_type == "gpt2" and template.endswith(".bias"):  # bias=false: zeros are exact
                weights = [state[k.removesuffix(".bias") + ".weight"] for k in keys]
                out[template.format(**at)] = torch.zeros(sum(w.shape[0] for w in weights),
                                                         dtype=weights[0].dtype)
    return out  # torch.cat copies: nothing shares memory with the model


_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def stored_dtype(weights: Path) -> torch.dtype:
    """The dtype of the run's float tensors on disk: an imported bfloat16 checkpoint stays bfloat16
    (the model computes in float32; the cast back is exact). float32 when they differ."""
    with safe_open(str(weights), framework="pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    (only,) = dtypes if len(dtypes) == 1 else (None,)
    return _DTYPES.get(only, torch.float32)


# --- tokenizer and special tokens ------------------------------------------------------------------


# --- the export ------------------------------------------------------------------------------------


__all__ = ["HF_CLASSES", "export_state_dict", "hf_config", "hf_mismatches", "model_type_for", "stored_dtype"]
