"""Import Hugging Face checkpoints into `CausalLM`: the engine that reads each family's spec
(handformer/families: `from_hf_config` and the tensor map `tensors`); it knows no family by name.

This is the one place where Hugging Face parameter names meet handformer's plain names. Each
family's tensor map is a declarative map from a Hugging Face key template to handformer key(s), applied
strictly: every checkpoint key is used (only the non-weight buffers listed per architecture are
skipped), every `CausalLM` key is filled, and every shape matches; anything else raises one
`ValueError` that lists all the missing keys, unexpected keys and shape mismatches.

It does not import `transformers`: it works from a config.json dict and a state dict of tensors
(for example read from safetensors files).

    hf_config = json.load(open("config.json"))
    cfg = config_from_hf(hf_config)
    model = CausalLM(cfg)
    load_hf_into(model, safetensors.torch.load_file("model.safetensors"), hf_config["model_type"])

Layout notes (the maps are in the specs): GPT-2 stores its Linear layers as `Conv1D` with (in,
    out) weights, so they are
transposed, and it fuses the query, key and value projections into one `c_attn`, which is split
in q, k, v order. Llama uses half-split RoPE like handformer, so q/k weights load without
permuting. Qwen2, Mistral and Gemma name their tensors as Llama does (the variations are in the
config: see each spec's `from_hf_config`). Phi-3 fuses q, k, v into `qkv_proj` (rows q, then k, then v)
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
from typing import Any

import torch
from torch import Tensor

from handformer.config import CausalLMConfig
from handformer.convert.mxfp4 import dequantize_mxfp4
from handformer.families import build_causal_lm
from handformer.families.catalogue import SPECS, look_alike
from handformer.families.hf_config import unsupported, windows
from handformer.families.spec import FamilySpec, HFTensors, Target
from handformer.models.causal_lm import CausalLM

Architecture = HFTensors  # a family's Hugging Face tensor map (families/spec.py)
HEAD = "lm_head.weight"  # the output head's key, in Hugging Face and in handformer alike
# model_type -> its checkpoints' tensor map, from the catalogue (each spec's `tensors`)
ARCHITECTURES: dict[str, HFTensors] = {model_type: spec.tensors for model_type, spec in SPECS.items()}


def _spec(model_type: Any) -> FamilySpec:
    if model_type not in SPECS:
        raise ValueError(f"unsupported model_type {model_type!r}{other_family(model_type)}; "
                         f"supported: {', '.join(SPECS)}")
    return SPECS[model_type]


# --- config.json -> CausalLMConfig ----------------------------------------------------------------

# Settings of model families that handformer implements for some families only (or for none): key
# -> (is the value harmless?, what it asks for); the families that implement one name it in their
# spec's `hf_keys`. Checked for every config, before anything else, so a Llama config with
# soft-capping or experts is refused by the key that makes the difference.
_NOT_IMPLEMENTED: dict[str, tuple[Callable[[Any], bool], str]] = {
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
    "clip_qkv": (lambda v: v is None, "clipping queries, keys and values"),
}


def check_implemented(c: dict[str, Any]) -> None:
    """Refuse a config that asks for something handformer does not implement for its family,
    naming the key and its value (see `_NOT_IMPLEMENTED`; also layer kinds a family ignores)."""
    model_type = c.get("model_type")
    for key, (harmless, what) in _NOT_IMPLEMENTED.items():
        families = tuple(t for t, spec in SPECS.items() if key in spec.hf_keys)
        if key in c and not harmless(c[key]) and model_type not in families:
            where = f" for {model_type} (only for {', '.join(families)})" if families else ""
            unsupported(c, key, c[key], f"{what} is not implemented in handformer{where}")
    if c.get("use_sliding_window", True):  # the Qwen families ignore their sliding_window without this flag
        _, global_layers = windows(c, c.get("sliding_window"))
        readers = tuple(t for t, spec in SPECS.items() if spec.layer_types)
        if global_layers and model_type not in readers:
            unsupported(c, "layer_types", c["layer_types"],
                "layers that alternate between sliding-window and "
                        f"full attention are read for {', '.join(readers)}; this family slides every layer")


def other_family(model_type: Any) -> str:
    """Why a known but unsupported model_type is not imported, as " (...)", or ""."""
    return look_alike(model_type)


def config_from_hf(hf_config: dict[str, Any]) -> CausalLMConfig:
    """A `CausalLMConfig` from a Hugging Face config.json dict (model_type one of ARCHITECTURES),
    with dropout 0. Options handformer does not implement raise `ValueError` naming them."""
    check_implemented(hf_config)
    return _spec(hf_config.get("model_type")).from_hf_config(hf_config)


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


def concrete(template: str, target: Target, cfg: CausalLMConfig) -> list[tuple[str, Target]]:
    """(checkpoint key, its targets) for each layer and expert a map entry covers; a stacked
    target lists every expert's keys, expert by expert."""
    found = []
    for at in instances(template, cfg):
        experts = range(cfg.moe.n_experts if cfg.moe else 0) if target.stacked else [at["e"]]
        keys = tuple(k.format(i=at["i"], e=e) for e in experts for k in target.keys)
        found.append((template.format(**at), dataclasses.replace(target, keys=keys)))
    return found


def _plan(arch: HFTensors, cfg: CausalLMConfig, expected: dict[str, tuple[int, ...]]) -> dict[str, Target]:
    """Checkpoint key -> concrete target, for each map entry whose targets the model has."""
    plan = {}
    for template, target in arch.weights.items():
        for key, concrete_target in concrete(template, target, cfg):
            if concrete_target.keys and all(k in expected for k in concrete_target.keys):
                plan[key] = concrete_target
    return plan


def _unstack(state: dict[str, Tensor], arch: HFTensors, cfg: CausalLMConfig) -> dict[str, Tensor]:
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


def expert_groups(target: Target, cfg: CausalLMConfig) -> list[tuple[str, ...]]:
    """A target's keys, one group a source slice: each expert's (stacked) or all of them."""
    n = len(target.keys) // cfg.moe.n_experts if target.stacked and cfg.moe else len(target.keys)
    return [target.keys[j:j + n] for j in range(0, len(target.keys), n)]


def _past_last_layer(key: str, prefix: str, n_layers: int) -> bool:
    """Whether `key` belongs to a layer from n_layers on ("model.layers.61.eh_proj.weight")."""
    found = re.match(re.escape(prefix) + r"layers\.(\d+)\.", key)
    return found is not None and int(found.group(1)) >= n_layers


def _source_shape(target: Target, expected: dict[str, tuple[int, ...]],
                  cfg: CausalLMConfig) -> tuple[int, ...]:
    """The checkpoint shape the targets need: their shapes stacked along dim 0, transposed for
    Conv1D; (E, ...) with each expert's slice so for stacked experts."""
    groups = expert_groups(target, cfg)
    shapes = [expected[k] for k in groups[0]]
    shape = shapes[0] if len(shapes) == 1 else (sum(s[0] for s in shapes), *shapes[0][1:])  # () for a scalar
    shape = shape[::-1] if target.transpose else shape
    return (len(groups), *shape) if target.stacked else shape


def pairs_to_halves(w: Tensor, head_dim: int, rotary_dim: int | None = None) -> Tensor:
    """Rows of RoPE's adjacent pairs (x0, y0, x1, y1, ...) per head -> half-split (x0, x1, ..., y0,
    y1, ...), the order handformer's RoPE turns: (H*Dh, ...) -> (H*Dh, ...). With partial RoPE only
    each head's first `rotary_dim` rows move (GLM-4 turns half of them); the rest stay."""
    r = rotary_dim or head_dim
    heads = w.reshape(-1, head_dim, *w.shape[1:])  # (H, Dh, ...)
    turned = heads[:, :r].reshape(-1, r // 2, 2, *w.shape[1:]).transpose(1, 2)  # (H, 2, r/2, ...)
    return torch.cat([turned.reshape(-1, r, *w.shape[1:]), heads[:, r:]], dim=1).reshape(w.shape)


def halves_to_pairs(w: Tensor, head_dim: int, rotary_dim: int | None = None) -> Tensor:
    """The inverse of `pairs_to_halves`."""
    r = rotary_dim or head_dim
    heads = w.reshape(-1, head_dim, *w.shape[1:])  # (H, Dh, ...)
    turned = heads[:, :r].reshape(-1, 2, r // 2, *w.shape[1:]).transpose(1, 2)  # (H, r/2, 2, ...)
    return torch.cat([turned.reshape(-1, r, *w.shape[1:]), heads[:, r:]], dim=1).reshape(w.shape)


def _apply(tensor: Tensor, target: Target, expected: dict[str, tuple[int, ...]],
           cfg: CausalLMConfig) -> dict[str, Tensor]:
    """The target tensors, as views of `tensor` (a transposed Conv1D weight is a strided view:
    whoever stores it makes it contiguous, one tensor at a time)."""
    out = {}
    groups = expert_groups(target, cfg)
    for keys, part in zip(groups, tensor if target.stacked else [tensor]):  # each expert's (rows, cols)
        if target.transpose:
            part = part.t()  # (in, out) -> Linear (out, in)
        if target.rope_pairs:  # RoPE's adjacent pairs -> handformer's half-split rows (a copy)
            part = pairs_to_halves(part, cfg.head_dim, cfg.rotary_dim)
        if target.interleaved:  # row r of the source is row r // n of key r % n
            out.update({k: part[j::len(keys)] for j, k in enumerate(keys)})
        elif len(keys) == 1:  # the whole tensor (a scalar has no dim 0 to split)
            out[keys[0]] = part
        else:
            out.update(zip(keys, part.split([expected[k][0] for k in keys], dim=0)))
    return out


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
    arch = _spec(model_type).tensors
    state, note = _with_base_prefix(hf_state, arch.base_prefix)
    quantized = [t.format(**at) for t in arch.mxfp4 for at in instances(t, cfg)]
    state = dequantize_mxfp4(_unstack(state, arch, cfg), quantized)
    if arch.extra_layers:
        state = {k: v for k, v in state.items() if not _past_last_layer(k, arch.base_prefix, cfg.n_layers)}
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
        shape = _source_shape(target, expected, cfg)
        if tuple(state[key].shape) != shape:
            problems["shape mismatches"].append(f"{key}: checkpoint {tuple(state[key].shape)}, "
                                                f"expected {shape} (-> {', '.join(target.keys)})")
        else:
            out.update(_apply(state[key], target, expected, cfg))
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
           "concrete", "convert_hf_state_dict", "expert_groups", "load_hf_into", "model_from_hf"]
