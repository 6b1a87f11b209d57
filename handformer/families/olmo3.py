"""OLMo 3 (7B, 32B): OLMo 2's block (norms on each sublayer's output, q/k norms over the width) with
three sliding-window layers to one global (layer_types), each kind with its RoPE (rope_parameters
per layer type). Only settings differ from OLMo 2: the same variants and tensor names."""

from __future__ import annotations

import dataclasses
from typing import Any

from handformer.config import CausalLMConfig
from handformer.families.hf_config import (
    layer_types_keys,
    require,
    rope_parameters,
    unsupported,
    window_settings,
)
from handformer.families.olmo import OLMO2
from handformer.families.spec import Differences, FamilySpec


def _rope(c: dict[str, Any]) -> float:
    """The one RoPE base of both kinds of layer (other RoPEs per kind are refused by name)."""
    per_type = c.get("rope_parameters") or {}
    thetas = set()
    for kind in ("sliding_attention", "full_attention"):
        theta, _ = rope_parameters(c, "rope_parameters", per_type.get(kind) or {}, ("default",))
        thetas.add(float(theta or c.get("rope_theta", 500000.0)))
    if len(thetas) != 1:
        unsupported(c, "rope_parameters", per_type, "handformer turns OLMo 3's sliding and global layers "
                    "with one RoPE base")
    return thetas.pop()


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """OLMo 3: OLMo 2's block, sliding and global layers as layer_types says (by default every
    fourth layer global)."""
    if not c.get("layer_types"):
        n_layers = require(c, "num_hidden_layers")
        kinds = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n_layers)]
        c = {**c, "layer_types": kinds}
    olmo2 = OLMO2.from_hf_config({**c, "rope_parameters": None, "rope_scaling": None})
    return dataclasses.replace(olmo2, rope_theta=_rope(c), **window_settings(c, c.get("sliding_window")))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    return {**OLMO2.to_hf_config(cfg), "sliding_window": cfg.sliding_window,
            "layer_types": layer_types_keys(cfg),
            "rope_parameters": {"sliding_attention": rope, "full_attention": rope}}


OLMO3 = FamilySpec(
    model_type="olmo3", name="OLMo 3", hf_class="Olmo3ForCausalLM",
    fixed={**{k: v for k, v in OLMO2.fixed.items() if k != "sliding_window"},
           "rope_scaling": (None, "turns both kinds of layer with plain RoPE in handformer")},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=OLMO2.tensors,
    may_set=frozenset({"qk_norm", "global_layers"}), layer_types=True,
    variants=OLMO2.variants,
    claims=((29, lambda c: c.norm_placement == "reordered" and c.sliding_window is not None),),
    differences=Differences(norm="on each sublayer's output", attention="q/k norms over the whole width",
                            cache="three sliding layers to one global"))

__all__ = ["OLMO3"]
