"""The llama.cpp architectures handformer writes and reads as GGUF: the engine that reads each
family's `GgufEntry` (its spec's `gguf`, handformer/families); it knows no family by name.

An entry says, declaratively, what llama.cpp's model of that name is:
- `tensors`: GGUF tensor name ({i} = block) -> the handformer key(s) it holds; several keys are
  joined along dim 0 in that order (Phi-3's attn_qkv is q, k, v; its ffn_up is gate, then up;
  GPT-2's attn_qkv likewise). The names are llama.cpp's (gguf.TENSOR_NAMES); the map is applied
  strictly both ways: every handformer tensor is written, every GGUF tensor is read.
- `settings`: the CausalLMConfig settings the architecture fixes, each with why. An export checks
  them (one ValueError lists every one that differs); an import builds the config with them.
- the layout differences: `rope="pairs"` (llama.cpp's Llama rotates adjacent pairs, so the query
  and key rows of each head are permuted from handformer's half-split order, as llama.cpp's
  convert_hf_to_gguf.py does for Hugging Face weights), `norm_offset` (Gemma: GGUF holds the gain
  1 + w, handformer stores w), `zero_biases` (GPT-2: llama.cpp needs every bias, so a run without
  biases writes zeros, and an import reads all-zero biases as none).
What a family stores its own way beyond these (its own keys, one tensor's layout, a tensor split in
two) is its entry's `code` (a `GgufCode`), which the engine runs after its shared steps.
The hyperparameters go in the usual keys ({arch}.context_length, .embedding_length, ...).

What llama.cpp fixes beyond the Hugging Face architecture (Gemma 2/3's layer pattern, query scale
and local RoPE base; SmolLM3's every-fourth NoPE layer) is in the entry's flags, so a run with
other values is refused by the setting. A family without an entry (the other mixtures of experts)
runs in handformer from its Hugging Face checkpoint (import-hf, export-hf); a run with its settings
is refused by export-gguf, by name, and such a GGUF file by import-gguf (the spec's `gguf_unread`).

Shape legend: D d_model, H heads, Hkv key/value heads, Dh head dim, F d_ff, V vocab.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import gguf
import torch
from torch import Tensor

from handformer.config import (
    CausalLMConfig,
    FamilyConfig,
    Llama3RopeScaling,
    LongRopeScaling,
    MoEConfig,
    setting_name,
    setting_value,
)
from handformer.convert.hf_weights import halves_to_pairs, pairs_to_halves
from handformer.families.catalogue import GGUF_ENTRIES, SPECS, spec_of
from handformer.families.gguf_keys import read_float, read_int
from handformer.families.spec import GgufEntry
from handformer.settings import is_number

Family = GgufEntry  # a family's llama.cpp entry (families/spec.py)

# general.architecture -> the entry import-gguf reads it with (Mixtral, llama.cpp's Llama with
# experts, is told apart by its expert count: `entry_of`); model_type (Hugging Face's, as runs
# record it) -> the entry export-gguf writes it as (Mistral without a window is Llama's
# computation, and llama.cpp's convert writes it as Llama).
FAMILIES: dict[str, GgufEntry] = {}
for _entry in GGUF_ENTRIES:
    FAMILIES.setdefault(_entry.arch, _entry)
BY_MODEL_TYPE: dict[str, GgufEntry] = {
    **{e.model_type: e for e in FAMILIES.values()},
    **{spec.model_type: spec.gguf for spec in SPECS.values() if spec.gguf is not None},
    **{alias: e for e in GGUF_ENTRIES for alias in e.also_recorded}}
# Architectures llama.cpp has that import-gguf does not read yet, and what they would need.
NOT_YET = {arch: why for spec in SPECS.values() for arch, why in spec.gguf_unread.items()}
# Of those, the ones handformer runs from their Hugging Face checkpoints: arch -> model_type.
FROM_HF = {arch: spec.model_type for spec in SPECS.values() if spec.gguf is None for arch in spec.gguf_unread}
_LONGROPE = next(e for e in GGUF_ENTRIES if e.longrope)  # the architecture that names LongRoPE's keys


def entry_of(arch: str, experts: bool) -> GgufEntry | None:
    """The entry for a file of architecture `arch` (with or without {arch}.expert_count)."""
    entries = [e for e in GGUF_ENTRIES if e.arch == arch]
    return next((e for e in entries if e.experts == experts), entries[0] if entries else None)


# Settings of today's families that no architecture here writes: name -> (the value without it,
# what it is). A run with one exports to Hugging Face only (export-hf).
_NOT_WRITTEN = {"qk_norm": ("none", "q/k norms"), "moe": (None, "mixture of experts"),
                "rope_fraction": (1.0, "partial rotary embeddings"),
                "global_layers": ([], "global layers beside sliding-window ones"),
                "nope_layers": ([], "layers without RoPE"), "rope_local_theta": (None, "second RoPE base"),
                "attn_scale_dim": (None, "query scale of its own"),
                "attn_softcap": (None, "soft-capped attention scores"),
                "logit_softcap": (None, "soft-capped logits"),
                "embedding_multiplier": (None, "embedding multiplier"),
                "attention_multiplier": (None, "attention multiplier"),
                "residual_multiplier": (None, "residual multiplier"),
                "logits_scaling": (None, "logits scaling"),
                "attn_sinks": (False, "attention sinks"), "swiglu_limit": (None, "clamped SwiGLU experts"),
                "mla": (None, "multi-head latent attention"),
                "deltanet": (None, "gated DeltaNet linear attention"),
                "attn_output_gate": (False, "gated attention output"),
                "query_scale_beta": (None, "queries scaled by their position")}


def family_for(cfg: CausalLMConfig, recorded: str | None) -> Family:
    """The family a run exports to: the model_type recorded at import (a fine-tune's base run's),
    else the one export-hf chooses from its settings; a run whose settings point to a family no
    entry here writes goes to the closest one, whose `mismatches` then name those settings."""
    if recorded is not None:
        if recorded not in BY_MODEL_TYPE:
            unread = SPECS[recorded].gguf_unread if recorded in SPECS else {}
            why = "".join(f" (llama.cpp's {arch}: {reason}, which export-gguf does not write yet)"
                          for arch, reason in unread.items())
            raise ValueError(f"this run was imported from model_type {recorded!r}{why}; export-gguf writes "
                             f"{', '.join(BY_MODEL_TYPE)}")
        return BY_MODEL_TYPE[recorded]
    from handformer.convert.hf_export import model_type_for

    if cfg.position not in ("learned", "rope"):
        raise ValueError(f"position={cfg.position!r} maps to no llama.cpp architecture: GPT-2 has "
                         "position='learned', the Llama family position='rope'")
    found = BY_MODEL_TYPE.get(model_type_for(cfg))
    if found is not None:
        return found
    fallback = spec_of(cfg, tuple(spec for spec in SPECS.values() if spec.gguf_fallback))
    assert fallback.gguf is not None
    return fallback.gguf


def _global_layers(family: Family, n_layers: int) -> list[int]:
    """The layers llama.cpp's Gemma 2/3 run without the window."""
    p = family.swa_pattern
    return [i for i in range(n_layers) if i % p == p - 1]


def _nope_layers(family: Family, n_layers: int) -> list[int]:
    return [i for i in range(n_layers) if (i + 1) % family.nope_step == 0]


def _window(cfg: CausalLMConfig) -> int | None:
    """The run's sliding window, or None when there is none or it spans the whole context."""
    window = cfg.sliding_window
    return window if window is not None and window < cfg.max_positions else None


def _layer_problems(cfg: CausalLMConfig, family: Family) -> list[str]:
    """Gemma 2/3's settings llama.cpp fixes: which layers slide, the query scale, soft-capping and
    Gemma 3's local RoPE base."""
    problems = []
    name = family.name
    if family.swa_pattern and _window(cfg) is not None:
        expected = _global_layers(family, cfg.n_layers)
        if list(cfg.global_layers) != expected:
            problems.append(f"global_layers={cfg.global_layers!r} (llama.cpp's {name} makes layer i global "
                            f"when i % {family.swa_pattern} = {family.swa_pattern - 1}: {expected} for "
                            f"{cfg.n_layers} layers)")
        local = cfg.family.rope_local_theta if cfg.family.rope_local_theta is not None else cfg.rope_theta
        if family.local_rope_theta is not None and local != family.local_rope_theta:
            setting = "family.rope_local_theta" if cfg.family.rope_local_theta is not None else "rope_theta"
            problems.append(f"{setting}={local!r} (llama.cpp's {name} turns the sliding layers' RoPE with "
                            f"base {family.local_rope_theta:g})")
    scale_dim = cfg.family.attn_scale_dim
    if scale_dim is not None and scale_dim != cfg.head_dim:
        problems.append(f"family.attn_scale_dim={scale_dim!r} (llama.cpp's {name} divides scores by "
                        f"sqrt(head_dim) = sqrt({cfg.head_dim}))")
    if family.softcaps:
        for setting in ("attn_softcap", "logit_softcap"):
            if getattr(cfg.family, setting) is None:
                problems.append(f"family.{setting}=None (llama.cpp's {name} always soft-caps "
                                f"{'scores' if setting == 'attn_softcap' else 'logits'}; Gemma 2's are 50 "
                                "and 30)")
    return problems


def _expert_problems(cfg: CausalLMConfig, family: Family) -> list[str]:
    moe = cfg.moe
    if moe is None:
        return [f"moe=None (llama.cpp's {family.name} has a mixture of experts in every layer)"]
    problems = []
    if not moe.normalize:
        problems.append(f"moe.normalize=False (llama.cpp's {family.name} rescales the top-k weights to "
                        "sum to 1)")
    if moe.d_shared:
        problems.append(f"moe.d_shared={moe.d_shared} (llama.cpp's {family.name} has no shared expert; "
                        "Qwen2-MoE has one)")
    return problems


def mismatches(cfg: CausalLMConfig, family: Family) -> list[str]:
    """Every setting of `cfg` that llama.cpp's `family` cannot express, each with why."""
    settings = dict(family.settings)
    if settings.get("n_kv_heads", (0,))[0] is None and cfg.n_kv_heads == cfg.n_heads:
        settings.pop("n_kv_heads")  # stated, but the same as None
    if cfg.sliding_window is not None and cfg.sliding_window >= cfg.max_positions:
        settings.pop("sliding_window", None)  # a window as long as the context: no window (noted)
    problems = [f"{setting_name(name)}={setting_value(cfg, name)!r} ({family.name} {why})"
                for name, (value, why) in settings.items() if setting_value(cfg, name) != value]
    problems += [f"{setting_name(name)}={setting_value(cfg, name)!r} (export-gguf writes no {what} for "
                 f"{family.name}; export-hf writes this run for transformers)"
                 for name, (value, what) in _NOT_WRITTEN.items()
                 if name not in family.writes and name not in settings and setting_value(cfg, name) != value]
    problems += _layer_problems(cfg, family)
    if family.hybrid_layers and cfg.n_layers == family.hybrid_layers:
        problems.append(f"n_layers={cfg.n_layers} (llama.cpp's {family.name} slides three layers in four at "
                        f"this depth, its own pattern; export-hf writes this run for transformers)")
    if family.experts:
        problems += _expert_problems(cfg, family)
    nope = _nope_layers(family, cfg.n_layers) if family.nope_step else []
    if family.nope_step and list(cfg.family.nope_layers) != nope:
        problems.append(f"family.nope_layers={cfg.family.nope_layers!r} (llama.cpp's {family.name} leaves "
                        f"RoPE out of layer i when (i + 1) % {family.nope_step} = 0: {nope} for "
                        f"{cfg.n_layers} layers)")
    if family.longrope:
        if cfg.rope_scaling is not None and not isinstance(cfg.rope_scaling, LongRopeScaling):
            problems.append(f"rope_scaling={cfg.rope_scaling!r} (llama.cpp's {family.name} takes LongRoPE "
                            "only)")
    elif (cfg.rope_scaling is not None
          and not isinstance(cfg.rope_scaling, (Llama3RopeScaling, *family.code.rope_scalings))):
        problems.append(f"rope_scaling={cfg.rope_scaling!r} (export-gguf writes Llama 3's rope scaling only; "
                        "export-hf writes this run for transformers)")
    if family.full_width_heads and cfg.n_heads * cfg.head_dim != cfg.d_model:
        problems.append(f"head_dim={cfg.head_dim} (llama.cpp's {family.name} needs n_heads * head_dim = "
                        f"d_model = {cfg.d_model})")
    return problems + family.code.problems(cfg)


# --- weights ---------------------------------------------------------------------------------------

def _pairs(w: Tensor, heads: int, rotary: int) -> Tensor:
    """Half-split RoPE rows (handformer, Hugging Face) -> adjacent pairs (llama.cpp's Llama), per head:
    rows (x_0..x_{r/2-1}, y_0..y_{r/2-1}) become (x_0, y_0, x_1, y_1, ...) for the `rotary` rows
    RoPE turns (all of a head's but in GLM-4, which turns half)."""
    return halves_to_pairs(w, w.shape[0] // heads, rotary)


def _halves(w: Tensor, heads: int, rotary: int) -> Tensor:
    """The inverse of `_pairs`."""
    return pairs_to_halves(w, w.shape[0] // heads, rotary)


def _is_norm_weight(key: str) -> bool:
    return key.endswith("norm.weight")


def to_gguf_layout(key: str, tensor: Tensor, cfg: CausalLMConfig, family: Family) -> Tensor:
    """One handformer tensor as the family stores it in GGUF."""
    if family.code.layout is not None:  # its own (Qwen3.5's DeltaNet)
        return family.code.layout(key, tensor, cfg, True)
    if family.rope == "pairs" and ".q_proj." in key:
        return _pairs(tensor, cfg.n_heads, cfg.rotary_dim)
    if family.rope == "pairs" and ".k_proj." in key:
        return _pairs(tensor, cfg.kv_heads, cfg.rotary_dim)
    if family.norm_offset and _is_norm_weight(key):
        return 1.0 + tensor.float()  # GGUF holds the gain; 1 + w is exact in float32 both ways
    return tensor


def from_gguf_layout(key: str, tensor: Tensor, cfg: CausalLMConfig, family: Family) -> Tensor:
    """The inverse of `to_gguf_layout`. Gemma's gains come back as fl(1 + w) - 1, whose 1 + w is
    the exported gain exactly: the imported model computes the same bits."""
    if family.code.layout is not None:
        return family.code.layout(key, tensor, cfg, False)
    if family.rope == "pairs" and ".q_proj." in key:
        return _halves(tensor, cfg.n_heads, cfg.rotary_dim)
    if family.rope == "pairs" and ".k_proj." in key:
        return _halves(tensor, cfg.kv_heads, cfg.rotary_dim)
    if family.norm_offset and _is_norm_weight(key):
        return tensor - 1.0
    return tensor


def _concrete(family: Family, cfg: CausalLMConfig) -> list[tuple[str, tuple[str, ...]]]:
    """(GGUF name, handformer keys) for every layer; a stacked experts' tensor lists every expert."""
    experts = range(cfg.moe.n_experts if cfg.moe is not None else 0)
    return [(name.format(i=i), tuple(k.format(i=i, e=e) for k in keys
                                     for e in (experts if "{e}" in k else [None])))
            for name, keys in family.tensors.items()
            for i in (range(cfg.n_layers) if "{i}" in name else [None])]


def stacked(name: str) -> bool:
    """A mixture's experts, one tensor (E, rows, columns) joined along a new first dim."""
    return name.endswith(("_exps.weight", "_exps.bias"))  # gpt-oss's experts have biases: (E, rows)


def export_tensors(state: dict[str, Tensor], cfg: CausalLMConfig, family: Family) -> list[tuple[str, Tensor]]:
    """`CausalLM(cfg).state_dict()` -> (GGUF name, float32 tensor) in llama.cpp's layout. A tied
    head is left out; GPT-2's missing biases become zeros. Every handformer tensor must be written:
    a ValueError names any the map does not cover."""
    out, used = [], {"lm_head.weight"} if cfg.tie_embeddings else set()  # a tied head is the embedding
    used |= set(layer_value_keys(cfg, family))  # metadata in GGUF (`layer_values`)
    state = family.code.to_gguf(dict(state), cfg)  # DeepSeek-V3's kv_b_proj split
    for name, keys in _concrete(family, cfg):
        if name == "output.weight" and cfg.tie_embeddings:
            continue
        if all(k in state for k in keys):
            parts = [to_gguf_layout(k, state[k].float(), cfg, family) for k in keys]
            out.append((name, (torch.stack if stacked(name) else torch.cat)(parts, dim=0).contiguous()))
            used.update(keys)
        elif family.zero_biases and name.endswith(".bias"):  # llama.cpp's GPT-2 needs every bias
            weights = [state[k.removesuffix(".bias") + ".weight"] for k in keys]
            out.append((name, torch.zeros(sum(w.shape[0] for w in weights))))
    left = sorted(set(state) - used)
    if left:
        raise ValueError(f"{family.name} in GGUF has no place for {', '.join(left)}; handformer's "
                         "model has tensors this exporter does not know")
    return out


def layer_value_keys(cfg: CausalLMConfig, family: Family) -> dict[str, tuple[str, int]]:
    """handformer key -> (the metadata key holding it, its layer), for the family's `layer_values`."""
    return {template.format(i=i): (key, i) for key, template in family.layer_values.items()
            for i in range(cfg.n_layers)}


def layer_values(state: dict[str, Tensor], cfg: CausalLMConfig, family: Family) -> dict[str, list[float]]:
    """The numbers each layer learns that llama.cpp keeps in the metadata: key -> one float a layer."""
    out: dict[str, list[float]] = {key: [] for key in family.layer_values}
    for name, (key, _) in layer_value_keys(cfg, family).items():
        out[key].append(float(state[name]))  # (1,) or (): one number
    return out


def read_layer_values(metadata: dict[str, Any], cfg: CausalLMConfig, family: Family,
                      expected: dict[str, tuple[int, ...]], where: str) -> dict[str, Tensor]:
    """The inverse of `layer_values`, shaped as the model holds them. One number for an array
    stands for every layer, as llama.cpp reads it."""
    out = {}
    for name, (key, i) in layer_value_keys(cfg, family).items():
        if key not in metadata:
            raise ValueError(f"{where} lacks {key}, which every llama.cpp {family.arch} model has")
        values = metadata[key] if isinstance(metadata[key], list) else [metadata[key]] * cfg.n_layers
        if len(values) != cfg.n_layers or not all(is_number(v) for v in values):
            raise ValueError(f"{where}: {key} must hold one number a layer ({cfg.n_layers}), not "
                             f"{values[:8]!r}")
        out[name] = torch.tensor(float(values[i])).reshape(expected[name])
    return out


def import_plan(cfg: CausalLMConfig, family: Family, expected: dict[str, tuple[int, ...]]
                ) -> dict[str, tuple[str, ...]]:
    """GGUF name -> handformer keys, for every map entry whose keys `CausalLM(cfg)` has."""
    plan = {name: keys for name, keys in _concrete(family, cfg) if all(k in expected for k in keys)}
    if cfg.tie_embeddings:
        plan.pop("output.weight", None)
    return plan


def split_tensor(name: str, tensor: Tensor, keys: tuple[str, ...], cfg: CausalLMConfig, family: Family,
                 expected: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    """One GGUF tensor -> its handformer tensors (split along dim 0 by the expected shapes)."""
    parts = tensor.unbind(0) if stacked(name) else tensor.split([expected[k][0] for k in keys], dim=0)
    return {k: from_gguf_layout(k, p.contiguous(), cfg, family) for k, p in zip(keys, parts)}


def source_shape(name: str, keys: tuple[str, ...], expected: dict[str, tuple[int, ...]],
                 cfg: CausalLMConfig | None = None, family: Family | None = None) -> tuple[int, ...]:
    """The GGUF tensor's shape (a family's `layout` may reshape one tensor: taken on the meta device)."""
    if family is not None and family.code.layout is not None and cfg is not None and len(keys) == 1:
        meta = torch.empty(expected[keys[0]], device="meta")
        return tuple(family.code.layout(keys[0], meta, cfg, True).shape)
    shapes = [expected[k] for k in keys]
    if stacked(name):
        return (len(keys), *shapes[0])
    return (sum(s[0] for s in shapes), *shapes[0][1:])


# --- hyperparameters -------------------------------------------------------------------------------

def rope_factors(cfg: CausalLMConfig) -> Tensor:
    """Llama 3's scaling as llama.cpp applies it: a factor per rotary frequency (Dh/2,) that
    divides the frequency: 1 for short wavelengths, `factor` for long ones, blended in between.
    The same numbers llama.cpp's convert_hf_to_gguf.py writes to rope_freqs.weight."""
    s = cfg.rope_scaling
    assert s is not None
    dim = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low_wavelen, high_wavelen = s.original_max_positions / s.low_freq_factor, \
        s.original_max_positions / s.high_freq_factor
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(s.factor)
        else:
            smooth = ((s.original_max_positions / wavelen - s.low_freq_factor)
                      / (s.high_freq_factor - s.low_freq_factor))
            factors.append(1 / ((1 - smooth) / s.factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


# The four numbers behind rope_freqs.weight, which GGUF has no keys for: written so that an import
# gives the run's settings back (llama.cpp ignores keys it does not know). A file without them
# (from convert_hf_to_gguf.py) has them fitted from the factors.
SCALING_KEYS = {"factor": "handformer.rope_scaling.factor",
                "low_freq_factor": "handformer.rope_scaling.low_freq_factor",
                "high_freq_factor": "handformer.rope_scaling.high_freq_factor",
                "original_max_positions": "handformer.rope_scaling.original_context_length"}


# LongRoPE's settings as the run has them (the tensors hold float32 factors; attention_factor and
# factor may be left to be computed): written so that an import gives the run's settings back
LONGROPE_KEYS = {name: f"handformer.longrope.{name}"
                 for name in ("short_factor", "long_factor", "attention_factor", "factor")}


def longrope_tensors(cfg: CausalLMConfig) -> list[tuple[str, Tensor]]:
    """LongRoPE's two factor lists as llama.cpp's rope_factors_short / rope_factors_long (Dr/2,)."""
    s = cfg.rope_scaling
    if not isinstance(s, LongRopeScaling):
        return []
    return [("rope_factors_long.weight", torch.tensor(s.long_factor, dtype=torch.float32)),
            ("rope_factors_short.weight", torch.tensor(s.short_factor, dtype=torch.float32))]


def read_longrope(metadata: dict[str, Any], short: Tensor, long: Tensor, cfg: CausalLMConfig,
                  where: str) -> LongRopeScaling:
    """LongRoPE from rope_factors_short / _long and the original context (with the exact lists and
    attention factor handformer writes, when the file has them and they agree with the tensors)."""
    half = cfg.rotary_dim // 2
    for name, t in (("rope_factors_short", short), ("rope_factors_long", long)):
        if t.numel() != half:
            raise ValueError(f"{where}: {name}.weight has {t.numel()} factors; the rotated dims "
                             f"({cfg.rotary_dim}) have {half} frequencies")
    values: dict[str, Any] = {"short_factor": short.double().flatten().tolist(),
                              "long_factor": long.double().flatten().tolist()}
    ours = {name: metadata[key] for name, key in LONGROPE_KEYS.items() if key in metadata}
    if ours and all(torch.equal(torch.tensor(ours.get(n, []), dtype=torch.float32), t.float().flatten())
                    for n, t in (("short_factor", short), ("long_factor", long))):
        values = {**{"attention_factor": None, "factor": None}, **ours}
    else:
        key = _key(_LONGROPE, gguf.Keys.Rope.SCALING_ATTN_FACTOR)
        values["attention_factor"] = read_float(metadata, key, where, 1.0)
    original_key = _key(_LONGROPE, gguf.Keys.Rope.SCALING_ORIG_CTX_LEN)
    original = read_int(metadata, original_key, where, cfg.max_positions)
    return LongRopeScaling(original_max_positions=original, **values)


# The load-balancing loss's weight acts only in training; written so that an import gives it back
AUX_LOSS_KEY = "handformer.moe.aux_loss_coef"


def write_hparams(writer: Any, cfg: CausalLMConfig, family: Family) -> None:
    """The family's hyperparameter keys ({arch}.context_length, ...)."""
    writer.add_context_length(cfg.max_positions)
    writer.add_embedding_length(cfg.d_model)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_heads)
    if not family.code.heads:  # DeepSeek-V3's code writes its latent heads' own
        writer.add_head_count_kv(cfg.kv_heads)
    writer.add_vocab_size(cfg.vocab_size)
    if family.rms:
        writer.add_layer_norm_rms_eps(cfg.norm_eps)
    else:
        writer.add_layer_norm_eps(cfg.norm_eps)
    if family.rope is not None:
        writer.add_rope_dimension_count(cfg.rotary_dim)
        writer.add_rope_freq_base(cfg.rope_theta)
        if not family.code.heads:
            writer.add_key_length(cfg.head_dim)
            writer.add_value_length(cfg.head_dim)
    if family.writes_window:
        _write_window_longrope(writer, cfg)
    if family.swa_pattern:  # Gemma 2 always slides (4096 without the key): no window = the context
        window = _window(cfg)
        if window is not None or family.softcaps:
            writer.add_sliding_window(window or cfg.max_positions)
    if family.experts:
        _write_experts(writer, cfg, family)
    if family.multipliers:
        _write_multipliers(writer, cfg)
    if family.softcaps:
        writer.add_attn_logit_softcapping(cfg.family.attn_softcap)
        writer.add_final_logit_softcapping(cfg.family.logit_softcap)
    if isinstance(cfg.rope_scaling, Llama3RopeScaling):
        for name, key in SCALING_KEYS.items():
            value = getattr(cfg.rope_scaling, name)
            (writer.add_uint32 if isinstance(value, int) else writer.add_float32)(key, value)
    family.code.write(writer, cfg)
    if cfg.moe is not None and not family.experts:  # a mixture the family's code wrote (DeepSeek-V3's)
        writer.add_float64(AUX_LOSS_KEY, cfg.moe.aux_loss_coef)


def _write_window_longrope(writer: Any, cfg: CausalLMConfig) -> None:
    """Phi-3's window (0 = none, as convert_hf_to_gguf.py writes it) and LongRoPE's keys."""
    window = cfg.sliding_window if cfg.sliding_window and cfg.sliding_window < cfg.max_positions else 0
    writer.add_sliding_window(window)
    longrope = cfg.rope_scaling if isinstance(cfg.rope_scaling, LongRopeScaling) else None
    original = longrope.original_max_positions if longrope else cfg.max_positions
    writer.add_rope_scaling_orig_ctx_len(original)
    if longrope is not None:  # llama.cpp multiplies cos and sin by it
        writer.add_rope_scaling_attn_factors(longrope.cos_sin_factor(cfg.max_positions))
        for name in LONGROPE_KEYS:
            value = getattr(longrope, name)
            if isinstance(value, list):
                array, double = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT64
                writer.add_key_value(LONGROPE_KEYS[name], [float(v) for v in value], array, double)
            elif value is not None:
                writer.add_float64(LONGROPE_KEYS[name], value)


def _write_multipliers(writer: Any, cfg: CausalLMConfig) -> None:
    """Granite's four; llama.cpp reads all four: none set is 1 (scores: 1/sqrt(head_dim))."""
    f = cfg.family
    writer.add_embedding_scale(f.embedding_multiplier or 1.0)
    writer.add_attention_scale(f.attention_multiplier or cfg.head_dim ** -0.5)
    writer.add_residual_scale(f.residual_multiplier or 1.0)
    writer.add_logit_scale(f.logits_scaling or 1.0)


def _write_experts(writer: Any, cfg: CausalLMConfig, family: Family) -> None:
    assert cfg.moe is not None
    writer.add_expert_count(cfg.moe.n_experts)
    writer.add_expert_used_count(cfg.moe.top_k)
    if cfg.moe.d_expert is not None or not family.experts_d_ff:  # Mixtral's experts: d_ff wide
        writer.add_expert_feed_forward_length(cfg.moe.d_expert or cfg.d_ff)
    writer.add_float64(AUX_LOSS_KEY, cfg.moe.aux_loss_coef)


def _key(family: Family, template: str) -> str:
    return template.format(arch=family.arch)


# Keys that ask for something handformer's model does not do: key template -> (is the value
# harmless?, what it asks for). Checked on import, before the weights are read.
_NOT_IMPLEMENTED = {
    gguf.Keys.LLM.EXPERT_COUNT: (lambda v: not v, "a mixture-of-experts feed-forward"),
    gguf.Keys.Rope.SCALING_TYPE: (lambda v: v in (None, "none"), "rope scaling of that type (handformer "
                                  "has Llama 3's, from rope_freqs.weight)"),
    gguf.Keys.Rope.SCALING_FACTOR: (lambda v: v in (None, 0, 1, 0.0, 1.0), "linear rope scaling"),
    gguf.Keys.LLM.ATTN_LOGIT_SOFTCAPPING: (lambda v: not v, "soft-capped attention scores"),
    gguf.Keys.LLM.FINAL_LOGIT_SOFTCAPPING: (lambda v: not v, "soft-capped logits"),
    gguf.Keys.LLM.LOGIT_SCALE: (lambda v: v in (None, 1, 1.0), "scaled logits"),
    gguf.Keys.LLM.EMBEDDING_SCALE: (lambda v: v in (None, 1, 1.0), "scaled embeddings"),
    gguf.Keys.LLM.RESIDUAL_SCALE: (lambda v: v in (None, 1, 1.0), "scaled residuals"),
    gguf.Keys.Attention.SCALE: (lambda v: not v, "a custom attention scale"),
    gguf.Keys.Attention.CAUSAL: (lambda v: v in (None, True), "non-causal attention"),
}


def read_hparams(metadata: dict[str, Any], family: Family, where: str) -> dict[str, Any]:
    """CausalLMConfig settings from the family's hyperparameter keys (vocab, biases, tying and
    Llama 3 scaling come from the tensors; see gguf_import), then the family's own (`GgufCode.read`)."""
    _refuse_unread(metadata, family, where)
    k = lambda template: _key(family, template)  # noqa: E731
    d_model = read_int(metadata, k(gguf.Keys.LLM.EMBEDDING_LENGTH), where)
    n_heads = read_int(metadata, k(gguf.Keys.Attention.HEAD_COUNT), where)
    settings: dict[str, Any] = dict(
        d_model=d_model, n_heads=n_heads, n_layers=read_int(metadata, k(gguf.Keys.LLM.BLOCK_COUNT), where),
        n_kv_heads=read_int(metadata, k(gguf.Keys.Attention.HEAD_COUNT_KV), where, n_heads),
        d_ff=read_int(metadata, k(gguf.Keys.LLM.FEED_FORWARD_LENGTH), where),
        max_positions=read_int(metadata, k(gguf.Keys.LLM.CONTEXT_LENGTH), where),
        norm_eps=read_float(metadata, k(gguf.Keys.Attention.LAYERNORM_RMS_EPS if family.rms
                                    else gguf.Keys.Attention.LAYERNORM_EPS), where),
        dropout=0.0, attention_dropout=0.0)
    if family.rope is not None and not family.code.heads:  # DeepSeek-V3's code reads its own
        settings.update(_read_heads(metadata, family, d_model // n_heads, where))
    if family.hybrid_layers and settings["n_layers"] == family.hybrid_layers:
        raise ValueError(f"{where}: {settings['n_layers']} layers, where llama.cpp's {family.name} slides "
                         "three layers in four without RoPE in the fourth, which import-gguf does not read; "
                         "import the Hugging Face checkpoint (import-hf)")
    if family.writes_window:  # 0 or absent: no window
        window_key = k(gguf.Keys.Attention.SLIDING_WINDOW)
        window = read_int(metadata, window_key, where) if metadata.get(window_key) else None
        settings["sliding_window"] = window
    if family.swa_pattern:
        settings.update(_read_layers(metadata, family, settings, where))
    if family.nope_step:
        settings["nope_layers"] = _nope_layers(family, settings["n_layers"])
    if family.experts:
        settings["moe"] = _read_experts(metadata, family, settings["d_ff"], where)
    if family.multipliers:
        settings["family"] = FamilyConfig(**{name: read_float(metadata, k(template), where, 1.0)
                                             for template, name in _MULTIPLIERS.items()})
    settings.update({name: value for name, (value, _) in family.settings.items() if name != "n_kv_heads"})
    if "n_kv_heads" in family.settings and settings["n_kv_heads"] == n_heads:
        settings["n_kv_heads"] = None  # GPT-2's config says so by leaving it out
    return {**settings, **_read_own(metadata, family, settings, where)}


def _read_own(metadata: dict[str, Any], family: Family, settings: dict[str, Any], where: str
              ) -> dict[str, Any]:
    """The settings the family's own code reads (`GgufCode.read`); a mixture it builds gets its
    training weight (handformer's key)."""
    own = family.code.read(metadata, settings, where)
    if own.get("moe") is not None:
        coef = metadata.get(AUX_LOSS_KEY, MoEConfig.aux_loss_coef)
        own["moe"] = dataclasses.replace(own["moe"], aux_loss_coef=coef)
    return own


def _refuse_unread(metadata: dict[str, Any], family: Family, where: str) -> None:
    """A ValueError for a key that asks for what handformer's model does not do (_NOT_IMPLEMENTED),
    unless the family reads that key itself."""
    for template, (harmless, what) in _NOT_IMPLEMENTED.items():
        key = _key(family, template)
        if ((family.softcaps and template in _SOFTCAPS) or (family.multipliers and template in _MULTIPLIERS)
                or (family.experts and template == gguf.Keys.LLM.EXPERT_COUNT)
                or template in family.code.reads):
            continue
        if key in metadata and not harmless(metadata[key]):
            raise ValueError(f"{where} has {key}={metadata[key]!r}: {what}, which import-gguf "
                             "does not read")


def _read_heads(metadata: dict[str, Any], family: Family, default: int, where: str) -> dict[str, Any]:
    """head_dim (`default` without the key), the rotated fraction of each head and the RoPE base."""
    k = lambda template: _key(family, template)  # noqa: E731
    head_dim = read_int(metadata, k(gguf.Keys.Attention.KEY_LENGTH), where, default)
    value_dim = read_int(metadata, k(gguf.Keys.Attention.VALUE_LENGTH), where, head_dim)
    rotary = read_int(metadata, k(gguf.Keys.Rope.DIMENSION_COUNT), where, head_dim)
    if value_dim != head_dim:
        raise ValueError(f"{where}: value heads {value_dim} wide and key heads {head_dim} wide; "
                         "handformer's heads are one width")
    out: dict[str, Any] = {}
    partial = "rope_fraction" in family.writes  # Phi-4-mini, GLM-4
    if rotary != head_dim and partial and 0 < rotary < head_dim and rotary % 2 == 0:
        out["rope_fraction"] = rotary / head_dim  # the first dims of each head
    elif rotary != head_dim:
        raise ValueError(f"{where}: {k(gguf.Keys.Rope.DIMENSION_COUNT)}={rotary} rotates part of "
                         f"each {head_dim}-wide head; handformer rotates whole heads")
    return {**out, "head_dim": head_dim,
            "rope_theta": read_float(metadata, k(gguf.Keys.Rope.FREQ_BASE), where, 10000.0)}


def _read_experts(metadata: dict[str, Any], family: Family, d_ff: int, where: str) -> MoEConfig:
    width = _key(family, gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)
    return MoEConfig(
        n_experts=read_int(metadata, _key(family, gguf.Keys.LLM.EXPERT_COUNT), where),
        top_k=read_int(metadata, _key(family, gguf.Keys.LLM.EXPERT_USED_COUNT), where),
        d_expert=(read_int(metadata, width, where, d_ff)
                  if width in metadata or not family.experts_d_ff else None),  # Mixtral: d_ff wide
        aux_loss_coef=metadata.get(AUX_LOSS_KEY, MoEConfig.aux_loss_coef))


_MULTIPLIERS = {gguf.Keys.LLM.EMBEDDING_SCALE: "embedding_multiplier",  # Granite's, into its family section
                gguf.Keys.Attention.SCALE: "attention_multiplier",
                gguf.Keys.LLM.RESIDUAL_SCALE: "residual_multiplier",
                gguf.Keys.LLM.LOGIT_SCALE: "logits_scaling"}
_SOFTCAPS = {gguf.Keys.LLM.ATTN_LOGIT_SOFTCAPPING: ("attn_softcap", 50.0),  # llama.cpp's defaults
             gguf.Keys.LLM.FINAL_LOGIT_SOFTCAPPING: ("logit_softcap", 30.0)}


def _read_layers(metadata: dict[str, Any], family: Family, settings: dict[str, Any], where: str
                 ) -> dict[str, Any]:
    """Gemma 2/3's window, global layers, query scale, soft-capping and local RoPE base, as
    llama.cpp runs them (Gemma 2 slides with a 4096 window when the file has no key; Gemma 3
    without the key does not slide)."""
    key = _key(family, gguf.Keys.Attention.SLIDING_WINDOW)
    window = (read_int(metadata, key, where) if metadata.get(key) else 4096 if family.softcaps else None)
    out: dict[str, Any] = {"attn_scale_dim": settings["head_dim"]}  # 1/sqrt(head_dim) in llama.cpp
    if window is not None and window < settings["max_positions"]:
        out.update(sliding_window=window, global_layers=_global_layers(family, settings["n_layers"]))
        if family.local_rope_theta is not None:
            if out["global_layers"]:
                out["rope_local_theta"] = family.local_rope_theta
            else:  # every layer slides: all turn with the local base
                out["rope_theta"] = family.local_rope_theta
    if family.softcaps:
        for template, (name, default) in _SOFTCAPS.items():
            out[name] = read_float(metadata, _key(family, template), where, default)
    return out


def read_rope_scaling(metadata: dict[str, Any], factors: Tensor | None, cfg: CausalLMConfig,
                      where: str) -> Llama3RopeScaling | None:
    """Llama 3's scaling from rope_freqs.weight (and the handformer.rope_scaling.* keys when
    written by export-gguf; otherwise fitted from the factors), checked against the factors."""
    if factors is None:
        return None
    factors = factors.float().reshape(-1)
    if factors.numel() != cfg.head_dim // 2:
        raise ValueError(f"{where}: rope_freqs.weight has {factors.numel()} factors; the heads "
                         f"({cfg.head_dim} wide) have {cfg.head_dim // 2} rotary frequencies")
    if torch.all(factors == 1):
        return None
    not_llama3 = (f"{where}: rope_freqs.weight is not Llama 3's frequency scaling, the only one handformer "
                  "implements")
    if all(key in metadata for key in SCALING_KEYS.values()):
        scaling = Llama3RopeScaling(**{name: metadata[key] for name, key in SCALING_KEYS.items()})
    else:
        scaling = _fit_llama3(factors, cfg, where)
    try:
        expected = rope_factors(dataclasses.replace(cfg, rope_scaling=scaling))
    except ValueError:  # the fit gave settings no Llama 3 scaling has (a wavelength band upside down)
        raise ValueError(not_llama3) from None
    if not torch.allclose(expected, factors, rtol=1e-5, atol=0):
        raise ValueError(f"{not_llama3} (the closest, {scaling}, gives other factors)")
    return scaling


def _fit_llama3(factors: Tensor, cfg: CausalLMConfig, where: str) -> Llama3RopeScaling:
    """(factor, low_freq_factor, high_freq_factor, original_max_positions) behind the factors.
    Only the two wavelength thresholds matter, so low_freq_factor is taken as 1 (Llama 3.1's);
    the blended frequencies (at least two) fix the rest."""
    factor = float(factors.max())
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
    wavelen = 2 * math.pi / freqs
    f = factors.double()
    blended = (f > 1 + 1e-6) & (f < factor * (1 - 1e-6))
    if int(blended.sum()) < 2:
        raise ValueError(f"{where}: rope_freqs.weight blends fewer than two frequencies, too few to "
                         "recover Llama 3's scaling settings; export the model with handformer or "
                         "convert_hf_to_gguf.py from its Hugging Face checkpoint")
    # 1/f = (1 - s)/factor + s  =>  s = (1/f - 1/factor) / (1 - 1/factor);  s = A / wavelen - B
    s = (1 / f[blended] - 1 / factor) / (1 - 1 / factor)
    x = 1 / wavelen[blended]
    A, B = torch.linalg.lstsq(torch.stack([x, -torch.ones_like(x)], dim=1), s[:, None]).solution.flatten()
    high = 1 + 1 / float(B)  # with low_freq_factor = 1: B = 1 / (high - 1), A = context / (high - 1)
    context = round(float(A) * (high - 1))
    # The factors are float32: the fit is good to about 6 digits (4.0000005 for Llama 3.1's 4)
    return Llama3RopeScaling(factor=factor, low_freq_factor=1.0, high_freq_factor=float(f"{high:.6g}"),
                             original_max_positions=context)


__all__ = ["BY_MODEL_TYPE", "FAMILIES", "FROM_HF", "Family", "NOT_YET", "entry_of", "export_tensors",
    "family_for",
           "import_plan", "layer_value_keys", "layer_values",
           "read_layer_values", "longrope_tensors", "mismatches", "read_hparams", "read_longrope",
               "read_rope_scaling",
           "rope_factors", "split_tensor", "stacked", "write_hparams"]
