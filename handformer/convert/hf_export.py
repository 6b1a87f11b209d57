"""Export a language-model run as a Hugging Face `transformers` directory: the inverse of `hf_import`.

    export_hf("runs/shakespeare_char", "hf/shakespeare_char")
    # then: AutoModelForCausalLM.from_pretrained("hf/shakespeare_char")

The directory holds config.json, model.safetensors, tokenizer.json (+ tokenizer_config.json, so
`PreTrainedTokenizerFast` / `AutoTokenizer` load it) and generation_config.json.

The architecture is the one the model maps to exactly: an imported run goes back to the
model_type recorded at import; a trained run goes to GPT-2 when its positions are learned and to
Llama when they are rotary, and every other setting must then match that architecture (GPT-2:
LayerNorm, pre-norm, GELU or ReLU, one key/value head per query head; Llama: RMSNorm, pre-norm,
SwiGLU). A setting that does not map raises one `ValueError` naming each such setting.

The weights go through the same declarative map the import uses (`hf_weights.ARCHITECTURES`), read
backwards: split projections are concatenated in the listed order, GPT-2's Conv1D weights are
transposed back to (in, out). A GPT-2-style run trained without biases (bias=false) is exported
with zero biases, which computes the same function. No `transformers` import is needed to write.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import Tensor

from handformer.config import CausalLMConfig
from handformer.convert.hf_weights import ARCHITECTURES, HEAD
from handformer.io import atomic_write_bytes, atomic_write_text
from handformer.tasks.lm.run import LMRun, load_lm

HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
_GPT2_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


@dataclass
class ExportedLM:
    out_dir: Path
    model_type: str  # "gpt2" or "llama"
    architecture: str  # the Hugging Face class name
    notes: list[str] = field(default_factory=list)  # what the export chose that the run left open

    def summary(self) -> str:
        return f"{self.architecture} ({self.model_type}) -> {self.out_dir}"


# --- which architecture, and whether every setting maps --------------------------------------------

def _mismatches(cfg: CausalLMConfig, model_type: str) -> list[str]:
    """The settings of `cfg` that `model_type` cannot express, each with what it would need."""
    if model_type == "gpt2":
        want = {"norm": ("layernorm", "GPT-2 uses LayerNorm"),
                "norm_placement": ("pre", "GPT-2 is pre-norm"),
                "scale_embeddings": (False, "GPT-2 does not scale embeddings by sqrt(d_model)")}
    else:
        want = {"norm": ("rmsnorm", "Llama uses RMSNorm"), "norm_placement": ("pre", "Llama is pre-norm"),
                "activation": ("swiglu", "Llama's MLP is SwiGLU"),
                "scale_embeddings": (False, "Llama does not scale embeddings by sqrt(d_model)")}
    problems = [f"{name}={getattr(cfg, name)!r} ({why})" for name, (value, why) in want.items()
                if getattr(cfg, name) != value]
    if model_type == "gpt2" and cfg.activation not in _GPT2_ACTIVATIONS:
        problems.append(f"activation={cfg.activation!r} (GPT-2 supports {', '.join(_GPT2_ACTIVATIONS)})")
    if model_type == "gpt2" and cfg.kv_heads != cfg.n_heads:
        problems.append(f"n_kv_heads={cfg.n_kv_heads} (GPT-2 has one key/value head per query head)")
    if model_type == "gpt2" and not cfg.derived_head_dim:
        problems.append(f"head_dim={cfg.head_dim} (GPT-2's heads are d_model / n_heads wide)")
    if cfg.qkv_bias and not cfg.bias:
        problems.append("qkv_bias=True with bias=False (biases on q/k/v only are Qwen2's, not exported)")
    if cfg.sliding_window is not None:
        problems.append(f"sliding_window={cfg.sliding_window} (sliding-window attention is Mistral's, "
                        "not exported)")
    if cfg.rope_scaling is not None:
        problems.append("rope_scaling is set (Llama 3.1 frequency scaling is not exported)")
    return problems


def export_model_type(run: LMRun) -> str:
    """"gpt2" or "llama" for this run, or `ValueError` naming the settings that do not map."""
    cfg = run.model.cfg
    if "quantization" in run.config:
        raise ValueError(f"this run is quantized ({run.config['quantization'].get('weights')}); "
                         "export the float run it came from (its source_run)")
    if "lora" in run.config:
        raise ValueError("this run holds LoRA adapters on a base run; fold them in first with "
                         "`handformer merge RUN MERGED` and export MERGED")
    recorded = run.config.get("source", {}).get("model_type")
    if recorded is not None:
        model_type = recorded
        if model_type not in HF_CLASSES:
            raise ValueError(f"this run was imported from model_type {model_type!r}; export-hf writes "
                             f"{', '.join(HF_CLASSES)} only")
    elif cfg.position in ("learned", "rope"):
        model_type = "gpt2" if cfg.position == "learned" else "llama"
    else:
        raise ValueError(f"position={cfg.position!r} maps to no Hugging Face architecture export-hf "
                         "writes: GPT-2 needs position='learned', Llama position='rope'")
    problems = _mismatches(cfg, model_type)
    if problems:
        raise ValueError(f"cannot export to {HF_CLASSES[model_type]}: " + "; ".join(problems))
    return model_type


# --- config.json -----------------------------------------------------------------------------------

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
            "rms_norm_eps": cfg.norm_eps, "hidden_act": "silu", "attention_bias": cfg.bias,
            "mlp_bias": cfg.bias, "attention_dropout": cfg.attention_dropout,
            "head_dim": cfg.head_dim, "rope_theta": cfg.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta}}


# --- weights ---------------------------------------------------------------------------------------

def export_state_dict(state: dict[str, Tensor], cfg: CausalLMConfig, model_type: str) -> dict[str, Tensor]:
    """`CausalLM(cfg).state_dict()` -> the Hugging Face checkpoint's tensors (contiguous, own memory).
    Missing GPT-2 biases (bias=false) become zeros; a tied head is left out, as save_pretrained does.
    Shapes: GPT-2 c_attn (D, 3D) from q/k/v (D, D) each, Conv1D weights (in, out); Llama as stored."""
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


# --- tokenizer and special tokens ------------------------------------------------------------------

def _token_files(run: LMRun) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(ids for config.json, generation_config.json, tokenizer_config.json)."""
    tokens = run.tokens
    eos_ids = run.config.get("source", {}).get("eos_ids") or (
        [] if tokens.eos_id is None else [tokens.eos_id])
    eos = eos_ids[0] if len(eos_ids) == 1 else (eos_ids or None)
    ids = {"bos_token_id": tokens.bos_id, "eos_token_id": eos, "pad_token_id": tokens.pad_id}
    generation = {**ids, "_from_model_config": False}
    tok_config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "model_max_length": run.model.cfg.max_positions,
                                  "add_bos_token": tokens.bos_id is not None, "add_eos_token": False}
    for kind, token_id in (("bos", tokens.bos_id), ("eos", tokens.eos_id), ("pad", tokens.pad_id)):
        if token_id is not None:
            tok_config[f"{kind}_token"] = run.tokenizer.hf.id_to_token(token_id)
    return ids, generation, tok_config


# --- the export ------------------------------------------------------------------------------------

def export_hf(run_dir: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False) -> ExportedLM:
    """Write the language-model run in `run_dir` as a Hugging Face directory `out_dir`."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if out_dir.exists() and out_dir.resolve() == run_dir.resolve():
        raise ValueError(f"OUT_DIR must differ from RUN_DIR {run_dir}")
    if (out_dir / "config.json").exists() and not overwrite:
        raise ValueError(f"{out_dir} already holds a config.json; choose another directory or "
                         "pass --overwrite")
    run = load_lm(run_dir)
    model_type = export_model_type(run)
    cfg = run.model.cfg
    notes = []
    if model_type == "gpt2" and not cfg.bias:
        notes.append("the run has no biases (bias=false); GPT-2 always has them, so they are written as "
                     "zeros (the same function)")
    if model_type == "llama" and cfg.dropout:
        notes.append(f"Llama has no residual dropout; dropout={cfg.dropout} is left out (training only)")
    ids, generation, tok_config = _token_files(run)
    tensors = export_state_dict(run.model.state_dict(), cfg, model_type)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / "model.safetensors", st_save(tensors, metadata={"format": "pt"}))
    atomic_write_bytes(out_dir / "tokenizer.json", (run_dir / "tokenizer.json").read_bytes())
    for name, data in (("tokenizer_config.json", tok_config), ("generation_config.json", generation),
                       ("config.json", hf_config(cfg, model_type, ids))):  # config.json last: complete
        atomic_write_text(out_dir / name, json.dumps(data, indent=2) + "\n")
    return ExportedLM(out_dir, model_type, HF_CLASSES[model_type], notes)


__all__ = ["ExportedLM", "HF_CLASSES", "export_hf", "export_model_type", "export_state_dict", "hf_config"]
