"""Export a language-model run as a Hugging Face `transformers` directory: the inverse of `hf_import`.

    export_hf("runs/shakespeare_char", "hf/shakespeare_char")
    # then: AutoModelForCausalLM.from_pretrained("hf/shakespeare_char")

The directory holds config.json, model.safetensors, tokenizer.json (+ tokenizer_config.json, so
`PreTrainedTokenizerFast` / `AutoTokenizer` load it) and generation_config.json.

Which architecture (a model_type `import-hf` reads, so import(export(run)) is the run again):
- an imported run goes back to the model_type recorded at import; a fine-tuned or merged run to its
  base run's (followed through "init_from" / "merged_from" while the base run is there);
- any other run (trained here, imported from llama2.c) goes where its settings point (the families'
  `claims`, tried in rank order): learned positions to GPT-2; a mixture of experts to Qwen2-MoE
  (a shared expert), Qwen3-MoE (q/k norms per head), OLMoE (q/k norms over the width) or
  Mixtral; Gemma 2's block to Gemma 3 (with q/k norms) or Gemma 2; OLMo 2's to OLMo 2; layers
  without RoPE to SmolLM3; partial RoPE or LongRoPE to Phi-3; q/k norms to Qwen3; RoPE to Gemma
  with Gemma's norm, GeGLU and scaled embeddings, to Qwen2 with biases on q/k/v only, to Mistral
  with a sliding window, else to Llama (GQA, tied or untied head, rope_theta and Llama 3 rope
  scaling as set).
Every setting must then match that architecture (its spec's `fixed`, `may_set` and `problems`); one
`ValueError` names each setting that does not and what the architecture has instead. config.json's
keys are the spec's `to_hf_config`.

The weights go through the same declarative map the import uses (the spec's `tensors`), read
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

from handformer.config import CausalLMConfig, setting_name, setting_value
from handformer.convert.hf_import import ARCHITECTURES as HF_CLASSES
from handformer.convert.hf_weights import HEAD, concrete, expert_groups, halves_to_pairs
from handformer.families.catalogue import SPECS, spec_of
from handformer.families.spec import Target

# The settings only some families have: name -> (its value in a model without it, what it is). A
# family that may set one lists it in its spec's `may_set`; a run recorded as another family is
# refused by the setting's name.
FAMILY_SETTINGS: dict[str, tuple[Any, str]] = {
    "qk_norm": ("none", "q/k norms"),
    "moe": (None, "experts"),
    "rope_fraction": (1.0, "partial rotary embeddings"),
    "global_layers": ([], "global layers beside sliding-window ones"),
    "nope_layers": ([], "layers without RoPE"),
    "rope_local_theta": (None, "a RoPE base of the sliding layers"),
    "attn_scale_dim": (None, "a query scale of its own"),
    "attn_softcap": (None, "soft-capped attention scores"),
    "logit_softcap": (None, "soft-capped logits"),
    "embedding_multiplier": (None, "embedding multiplier"),
    "attention_multiplier": (None, "attention multiplier"),
    "residual_multiplier": (None, "residual multiplier"),
    "logits_scaling": (None, "logits scaling"),
    "attn_sinks": (False, "attention sinks"),
    "swiglu_limit": (None, "clamped SwiGLU experts"),
    "mla": (None, "multi-head latent attention"),
    "attn_output_gate": (False, "gated attention output"),
    "deltanet": (None, "gated DeltaNet linear attention"),
    "query_scale_beta": (None, "queries scaled by their position"),
}


# --- which architecture, and whether every setting maps --------------------------------------------

def hf_mismatches(cfg: CausalLMConfig, model_type: str) -> list[str]:
    """The settings of `cfg` that `model_type` cannot express, each with what it would need."""
    spec = SPECS[model_type]
    fixed = {"norm_placement": ("pre", "is pre-norm"),
             "position": (spec.position, f"has {spec.position} positions"), **spec.fixed}
    if fixed.get("n_kv_heads", (0,))[0] is None and cfg.n_kv_heads == cfg.n_heads:
        fixed.pop("n_kv_heads")  # stated, but the same as None
    problems = [f"{setting_name(name)}={setting_value(cfg, name)!r} ({spec.name} {why})"
                for name, (value, why) in fixed.items() if setting_value(cfg, name) != value]
    problems += [f"{setting_name(name)}={setting_value(cfg, name)!r} ({spec.name} has no {what})"
                 for name, (default, what) in FAMILY_SETTINGS.items()
                 if name not in spec.may_set and setting_value(cfg, name) != default]
    scaling = cfg.rope_scaling
    if scaling is not None and not isinstance(scaling, spec.rope_scalings):
        what = " or ".join(f"'{c().type}'" for c in spec.rope_scalings)
        problems.append(f"rope_scaling={scaling!r} ({spec.name} takes only {what} scaling in transformers)")
    return problems + spec.problems(cfg)


def model_type_for(cfg: CausalLMConfig) -> str:
    """Where a run's settings point: the family whose claim of lowest rank holds (each spec's
    `claims`; see the module docstring)."""
    if cfg.position not in ("learned", "rope"):
        raise ValueError(f"position={cfg.position!r} maps to no Hugging Face architecture export-hf "
                         "writes: GPT-2 needs position='learned', the Llama family position='rope'")
    return spec_of(cfg).model_type


# --- config.json -----------------------------------------------------------------------------------

def hf_config(cfg: CausalLMConfig, model_type: str, token_ids: dict[str, Any]) -> dict[str, Any]:
    """config.json for `cfg` as a Hugging Face `model_type` model."""
    spec = SPECS[model_type]
    common = {"architectures": [spec.hf_class], "model_type": model_type,
              "vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tie_embeddings,
              "dtype": "float32", **token_ids}
    return {**common, **spec.to_hf_config(cfg)}


# --- weights ---------------------------------------------------------------------------------------

def export_state_dict(state: dict[str, Tensor], cfg: CausalLMConfig, model_type: str) -> dict[str, Tensor]:
    """`CausalLM(cfg).state_dict()` -> the Hugging Face checkpoint's tensors (contiguous, own memory).
    Missing GPT-2 biases (bias=false) become zeros; a tied head is left out, as save_pretrained does.
    Shapes: GPT-2 c_attn (D, 3D) from q/k/v (D, D) each, Conv1D weights (in, out); Phi-3 qkv_proj
    (H*Dh + 2*Hkv*Dh, D), gate_up_proj (2F, D); the others as stored."""
    arch = SPECS[model_type].tensors
    out: dict[str, Tensor] = {}
    for template, target in arch.weights.items():
        if template == HEAD and cfg.tie_embeddings:
            continue
        for key, concrete_target in concrete(template, target, cfg):
            keys = concrete_target.keys
            if keys and all(k in state for k in keys):
                out[key] = _joined(state, concrete_target, cfg)
            elif keys and arch.zero_biases and template.endswith(".bias"):  # bias=false: zeros are exact
                weights = [state[k.removesuffix(".bias") + ".weight"] for k in keys]
                out[key] = torch.zeros(sum(w.shape[0] for w in weights), dtype=weights[0].dtype)
    return out  # torch.cat copies: nothing shares memory with the model


def _joined(state: dict[str, Tensor], target: Target, cfg: CausalLMConfig) -> Tensor:
    """The checkpoint tensor of `target`'s keys: split projections rejoined (their rows alternating
    where interleaved), a Conv1D weight transposed, a layer's experts stacked (E, ...)."""
    parts = []
    for keys in expert_groups(target, cfg):
        tensors = [state[k] for k in keys]
        if target.interleaved:  # (rows, ...) each -> (n * rows, ...), row r from tensor r % n
            joined = torch.stack(tensors, dim=1).flatten(0, 1)
        elif len(tensors) == 1:  # as it is (a scalar has no dim 0 to join along)
            joined = tensors[0].clone()
        else:
            joined = torch.cat(tensors, dim=0)
        if target.rope_pairs:  # back to the checkpoint's RoPE pairs
            joined = halves_to_pairs(joined, cfg.head_dim, cfg.rotary_dim)
        parts.append(joined.t() if target.transpose else joined)
    return (torch.stack(parts) if target.stacked else parts[0]).contiguous()


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


__all__ = ["FAMILY_SETTINGS", "HF_CLASSES", "export_state_dict", "hf_config", "hf_mismatches",
    "model_type_for", "stored_dtype"]
