"""Export a language-model run as a Hugging Face `transformers` directory: the inverse of `hf_import`.

    export_hf("runs/shakespeare_char", "hf/shakespeare_char")
    # then: AutoModelForCausalLM.from_pretrained("hf/shakespeare_char")

The directory holds config.json, model.safetensors, tokenizer.json (+ tokenizer_config.json, so
`PreTrainedTokenizerFast` / `AutoTokenizer` load it) and generation_config.json.

Which architecture (a model_type `import-hf` reads, so import(export(run)) is the run again):
- an imported run goes back to the model_type recorded at import; a fine-tuned or merged run to its
  base run's (followed through "init_from" / "merged_from" while the base run is there);
- any other run (trained here, imported from llama2.c) goes where its settings point: learned
  positions to GPT-2; RoPE to Gemma with Gemma's norm, GeGLU and scaled embeddings, to Qwen2 with
  biases on q/k/v only, to Mistral with a sliding window, else to Llama (GQA, tied or untied head,
  rope_theta and Llama 3 rope scaling as set).
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

from handformer.config import CausalLMConfig
from handformer.convert.hf_import import ARCHITECTURES as HF_CLASSES
from handformer.convert.hf_weights import ARCHITECTURES, HEAD

_GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
_NAMES = {"gpt2": "GPT-2", "llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "gemma": "Gemma",
          "phi3": "Phi-3"}
_NO_BIASES = {"bias": (False, "has no biases"), "qkv_bias": (False, "has no biases")}
_LLAMA_BLOCK = {"norm": ("rmsnorm", "uses RMSNorm"), "activation": ("swiglu", "has a SwiGLU MLP"),
                "scale_embeddings": (False, "does not scale embeddings by sqrt(d_model)")}
# model_type -> the settings its architecture fixes: name -> (value, why), checked on every export.
_FIXED: dict[str, dict[str, tuple[Any, str]]] = {
    "gpt2": {"norm": ("layernorm", "uses LayerNorm"),
             "scale_embeddings": (False, "does not scale embeddings by sqrt(d_model)"),
             "sliding_window": (None, "has no sliding-window attention"),
             "n_kv_heads": (None, "has one key/value head per query head")},
    "llama": {**_LLAMA_BLOCK, "sliding_window": (None, "has no sliding-window attention (Mistral has)")},
    "qwen2": {**_LLAMA_BLOCK, "bias": (False, "has biases on q/k/v only"),
              "qkv_bias": (True, "always has q/k/v biases")},
    "mistral": {**_LLAMA_BLOCK, **_NO_BIASES},
    "gemma": {"norm": ("rmsnorm_offset", "has RMSNorm with gain 1 + w"),
              "activation": ("geglu_tanh", "has a GeGLU MLP with the tanh GELU"),
              "scale_embeddings": (True, "scales embeddings by sqrt(d_model)"),
              "sliding_window": (None, "has no sliding-window attention (Gemma 2 has)"), **_NO_BIASES},
    "phi3": {**_LLAMA_BLOCK, **_NO_BIASES,
             "rope_scaling": (None, "takes only 'longrope' scaling in transformers, not Llama 3's")},
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
    if model_type == "gpt2" and cfg.activation not in _GPT2_ACTIVATIONS:
        problems.append(f"activation={cfg.activation!r} (GPT-2 supports {', '.join(_GPT2_ACTIVATIONS)})")
    if model_type == "gpt2" and not cfg.derived_head_dim:
        problems.append(f"head_dim={cfg.head_dim} (GPT-2's heads are d_model / n_heads wide)")
    if model_type == "llama" and cfg.qkv_bias and not cfg.bias:
        problems.append("qkv_bias=True with bias=False (Llama's attention_bias also covers o_proj; "
                        "Qwen2 has q/k/v biases only)")
    return problems


def model_type_for(cfg: CausalLMConfig) -> str:
    """Where a run's settings point (see the module docstring)."""
    if cfg.position == "learned":
        return "gpt2"
    if cfg.position != "rope":
        raise ValueError(f"position={cfg.position!r} maps to no Hugging Face architecture export-hf "
                         "writes: GPT-2 needs position='learned', the Llama family position='rope'")
    if cfg.norm == "rmsnorm_offset" or cfg.scale_embeddings or cfg.activation.startswith("geglu"):
        return "gemma"
    if cfg.qkv_bias and not cfg.bias:
        return "qwen2"
    return "mistral" if cfg.sliding_window is not None else "llama"


# --- config.json -----------------------------------------------------------------------------------

def _rope_parameters(cfg: CausalLMConfig) -> dict[str, Any]:
    """transformers 5's rope_parameters (the older rope_scaling keys, as import reads them)."""
    if cfg.rope_scaling is None:
        return {"rope_type": "default", "rope_theta": cfg.rope_theta}
    s = cfg.rope_scaling
    return {"rope_type": "llama3", "rope_theta": cfg.rope_theta, "factor": s.factor,
            "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_positions}


def _family_config(cfg: CausalLMConfig, model_type: str) -> dict[str, Any]:
    """The keys that set one Llama-like family apart."""
    window = cfg.sliding_window
    if model_type == "llama":
        return {"attention_bias": cfg.bias, "mlp_bias": cfg.bias}
    if model_type == "qwen2":  # a window on every layer, or on none
        kind = "full_attention" if window is None else "sliding_attention"
        return {"use_sliding_window": window is not None, "sliding_window": window,
                "max_window_layers": cfg.n_layers if window is None else 0,
                "layer_types": [kind] * cfg.n_layers}
    if model_type == "mistral":
        return {"sliding_window": window}
    if model_type == "gemma":
        return {"hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
                "attention_bias": False}
    original = cfg.rope_scaling.original_max_positions if cfg.rope_scaling else cfg.max_positions
    # phi3: its config defaults original_max_position_embeddings to 4096 (import reads it first)
    return {"sliding_window": window, "original_max_position_embeddings": original,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0}


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
            **({"rope_scaling": _rope_parameters(cfg)} if cfg.rope_scaling else {}),
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
        for i in range(cfg.n_layers) if "{i}" in template else [None]:
            keys = [k.format(i=i) for k in target.keys]
            if all(k in state for k in keys):
                tensor = torch.cat([state[k] for k in keys], dim=0)  # split projections, rejoined
                out[template.format(i=i)] = (tensor.t() if target.transpose else tensor).contiguous()
            elif model_type == "gpt2" and template.endswith(".bias"):  # bias=false: zeros are exact
                weights = [state[k.removesuffix(".bias") + ".weight"] for k in keys]
                out[template.format(i=i)] = torch.zeros(sum(w.shape[0] for w in weights),
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
