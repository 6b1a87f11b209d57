"""EXAONE 4.0 (EXAONE-4.0-1.2B, EXAONE-4.0-32B, `exaone4`): a block made of parts other families
already have, so no module of its own:

- the norms on each sublayer's output, as OLMo 2's: x = x + norm(f(x)) (`ReorderedNormBlock`; the
  checkpoint's post_attention_layernorm and post_feedforward_layernorm);
- RMSNorm on each query and key head before RoPE, as Qwen3's (`qk_norm = "head"`);
- in the hybrid models (32B) three sliding-window layers to one global ("LLLG", `layer_types`), and
  the global layers without RoPE ("global NoPE": `family.nope_layers`, `NoRopeAttention`). A model
  without a window (1.2B) turns every layer with RoPE.
"""

from __future__ import annotations

from typing import Any

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.hf_config import (
    layer_types_keys,
    require,
    rope_decoder,
    rope_decoder_keys,
    silu_only,
    window_settings,
)
from handformer.families.olmo import OLMO2
from handformer.families.spec import Differences, FamilySpec, GgufEntry


def _layer_types(c: dict[str, Any]) -> list[str]:
    """layer_types, or from sliding_window_pattern: every n-th layer global (an int), or a string of
    L (sliding) and G (global) repeated, the last layer global."""
    n_layers, pattern = require(c, "num_hidden_layers"), c.get("sliding_window_pattern")
    if c.get("layer_types"):
        return c["layer_types"]
    if c.get("sliding_window") is None or not pattern:
        return ["full_attention"] * n_layers
    if isinstance(pattern, str):
        kinds = ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention"
                 for i in range(n_layers)]
        return kinds[:-1] + ["full_attention"]
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """EXAONE 4: norms after each sublayer, q/k norms per head; with a sliding_window, the global
    layers of layer_types without RoPE (with one but no sliding layer: no layer turns)."""
    silu_only(c)
    kinds = _layer_types(c)
    windows = window_settings({**c, "layer_types": kinds}, c.get("sliding_window"))
    hybrid = c.get("sliding_window") is not None
    nope = [i for i, kind in enumerate(kinds) if hybrid and kind == "full_attention"]
    return rope_decoder(c, norm_placement="reordered", qk_norm="head", norm_eps=c.get("rms_norm_eps", 1e-5),
                        nope_layers=nope, **windows)


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    # global NoPE with no sliding layer: a window that no layer uses says so to transformers
    window = cfg.sliding_window or (cfg.max_positions if cfg.family.nope_layers else None)
    return {**rope_decoder_keys(cfg), "sliding_window": window, "layer_types": layer_types_keys(cfg),
            "sliding_window_pattern": None}


def problems(cfg: CausalLMConfig) -> list[str]:
    """EXAONE 4 leaves RoPE out of exactly its global layers when it slides, else of none (or all)."""
    nope = list(cfg.family.nope_layers)
    if nope == list(cfg.global_layers) if cfg.sliding_window else nope in ([], list(range(cfg.n_layers))):
        return []
    return [f"family.nope_layers={nope!r} (EXAONE 4 turns no RoPE in exactly its global layers "
            f"{list(cfg.global_layers)!r} when it slides, and RoPE in every layer without a window)"]


REORDERED = OLMO2.fixed["norm_placement"]
GGUF = GgufEntry(
    # OLMo 2's tensor names, its q/k norms here per head (Dh,)
    "exaone4", "exaone4", "EXAONE 4", OLMO2.gguf.tensors if OLMO2.gguf else {},
    {**llama.GGUF_BLOCK, **llama.NO_BIASES, "norm_placement": REORDERED, "qk_norm": llama.HEAD_QK_NORM,
     "sliding_window": (None, "slides only in its 64-layer model in llama.cpp; export-gguf writes "
                              "EXAONE 4 without windows")},
    biases=(), rope_freqs=True, hybrid_layers=64, writes=frozenset({"qk_norm"}))

EXAONE4 = FamilySpec(
    model_type="exaone4", name="EXAONE 4", hf_class="Exaone4ForCausalLM",
    fixed={**llama.LLAMA_BLOCK, **llama.NO_BIASES, "norm_placement": REORDERED,
           "qk_norm": llama.HEAD_QK_NORM},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=OLMO2.tensors, gguf=GGUF,
    problems=problems, may_set=frozenset({"qk_norm", "global_layers", "nope_layers"}),
    layer_types=True,
    claims=((28, lambda c: c.norm_placement == "reordered" and c.qk_norm == "head"),),
    variants=("ReorderedNormBlock", "NoRopeAttention"),
    differences=Differences(norm="on each sublayer's output", positions="no RoPE in the global layers "
                            "(hybrid models)", attention="q/k norms per head",
                            cache="three sliding layers to one global (32B)"))

__all__ = ["EXAONE4"]
