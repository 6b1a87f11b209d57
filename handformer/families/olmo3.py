"""OLMo 3 (7B, 32B): OLMo 2's block (norms on each sublayer's output, q/k norms over the width) with
three sliding-window layers to one global (layer_types), each kind with its RoPE (rope_parameters
per layer type: the long-context checkpoints turn the global layers with YaRN and the sliding ones
with plain RoPE, two RoPEs as Gemma 3's `LocalGlobalRotary`). Only settings differ from OLMo 2: the
same variants and tensor names."""

from __future__ import annotations

import dataclasses
from typing import Any

from handformer.config import CausalLMConfig, YarnRopeScaling
from handformer.families.hf_config import (
    layer_types_keys,
    require,
    rope_parameters,
    rope_parameters_keys,
    window_settings,
)
from handformer.families.olmo import OLMO2
from handformer.families.spec import Differences, FamilySpec


def _rope(c: dict[str, Any], windows: dict[str, Any]) -> dict[str, Any]:
    """rope_theta and rope_scaling of the global layers (YaRN on the long-context checkpoints; an
    older config's top-level rope_scaling is theirs, as transformers reads it), and rope_local_theta
    of the sliding ones (plain RoPE) where it differs. A model of one kind of layer needs one RoPE."""
    per_type, base = c.get("rope_parameters") or {}, c.get("rope_theta", 500000.0)
    if "full_attention" not in per_type and "sliding_attention" not in per_type:
        flat = {"rope_theta": base, **per_type}
        per_type = {"sliding_attention": flat, "full_attention": {**flat, **(c.get("rope_scaling") or {})}}
    full, sliding = per_type.get("full_attention") or {}, per_type.get("sliding_attention") or {}
    theta, scaling = rope_parameters(c, "rope_parameters", full, ("default", "yarn"))
    local, _ = rope_parameters(c, "rope_parameters", sliding, ("default",))
    theta, local = float(theta or base), float(local or base)
    if windows["sliding_window"] is None:  # every layer global
        return dict(rope_theta=theta, rope_scaling=scaling)
    if not windows["global_layers"]:  # every layer slides
        return dict(rope_theta=local, rope_scaling=None)
    differs = scaling is not None or local != theta
    return dict(rope_theta=theta, rope_scaling=scaling, rope_local_theta=local if differs else None)


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """OLMo 3: OLMo 2's block, sliding and global layers as layer_types says (by default every
    fourth layer global)."""
    if not c.get("layer_types"):
        n_layers = require(c, "num_hidden_layers")
        kinds = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n_layers)]
        c = {**c, "layer_types": kinds}
    olmo2 = OLMO2.from_hf_config({**c, "rope_parameters": None, "rope_scaling": None})
    windows = window_settings(c, c.get("sliding_window"))
    return dataclasses.replace(olmo2, **windows, **_rope(c, windows))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    sliding = {"rope_type": "default", "rope_theta": cfg.family.rope_local_theta or cfg.rope_theta}
    olmo2 = {k: v for k, v in OLMO2.to_hf_config(cfg).items() if k != "rope_scaling"}  # one per kind here
    return {**olmo2, "sliding_window": cfg.sliding_window,
            "layer_types": layer_types_keys(cfg),
            "rope_parameters": {"sliding_attention": sliding, "full_attention": rope_parameters_keys(cfg)}}


OLMO3 = FamilySpec(
    model_type="olmo3", name="OLMo 3", hf_class="Olmo3ForCausalLM",
    fixed={k: v for k, v in OLMO2.fixed.items() if k != "sliding_window"},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=OLMO2.tensors,
    may_set=frozenset({"qk_norm", "global_layers", "rope_local_theta"}), layer_types=True,
    rope_scalings=(YarnRopeScaling,),
    variants=(*OLMO2.variants, "LocalGlobalRotary"),
    claims=((29, lambda c: c.norm_placement == "reordered" and c.sliding_window is not None),),
    differences=Differences(norm="on each sublayer's output", attention="q/k norms over the whole width",
                            positions="YaRN on the global layers (long-context checkpoints)",
                            cache="three sliding layers to one global"))

__all__ = ["OLMO3"]
