"""Ministral 3 (Mistral's Ministral 3B, 8B, 14B; `ministral3`): Mistral's block and tensor names,
RoPE stretched by YaRN, and queries scaled by their position after RoPE (Llama 4's attention
temperature, `llama_4_scaling_beta`):

    q = q * (1 + beta * ln(1 + floor(position / original_max_position_embeddings)))

so past each multiple of the original context the softmax sharpens a little. The scale depends on
the position only, so the rotary module hands it out beside cos and sin (`PositionScaledRotary`)
and the attention multiplies the rotated queries by it (`PositionScaledAttention`).

Shape legend: B batch, T query length, S key length, H heads, Hkv key/value heads, Dh head dim.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

import handformer.families.llama as llama
from handformer.config import CausalLMConfig, FamilyConfig, YarnRopeScaling
from handformer.families.adopt import adopt_attention
from handformer.families.gguf_yarn import READ_HERE, read_yarn, write_yarn, yarn_problems
from handformer.families.hf_config import (
    rope_decoder,
    rope_decoder_keys,
    rope_parameters_keys,
    silu_only,
    unsupported,
    window_settings,
)
from handformer.families.spec import Differences, FamilySpec, GgufCode, GgufEntry
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.kv_cache import NO_CACHE, LayerCache
from handformer.replace import replace_layers


class PositionScaledRotary(nn.Module):
    """The model's rotary embedding, and the query scale of each position: 1 + beta * ln(1 +
    floor(position / positions))."""

    def __init__(self, rotary: nn.Module, beta: float, positions: int) -> None:
        super().__init__()
        self.rotary, self.beta, self.positions = rotary, beta, positions

    def forward(self, position_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(B|1, T) -> (cos, sin, scale): (B|1, 1, T, Dh) twice and (B|1, 1, T, 1)."""
        cos, sin = self.rotary(position_ids)
        scale = 1 + self.beta * torch.log(1 + torch.floor(position_ids / self.positions))  # (B|1, T)
        return cos, sin, scale[:, None, :, None].to(cos.dtype)


class PositionScaledAttention(MultiHeadAttention):
    """`MultiHeadAttention` whose rotated queries are multiplied by their position's scale (the
    third element of `rope`, from `PositionScaledRotary`). Only `project` differs."""

    def __init__(self, attn: MultiHeadAttention) -> None:
        adopt_attention(self, attn)

    def project(self, query: Tensor, key: Tensor, value: Tensor, rope: tuple[Tensor, ...] | None = None,
                cache: LayerCache = NO_CACHE) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V as the lesson's (B, H, T, Dh), (B, Hkv, S, Dh) twice; Q times its scale."""
        assert rope is not None, "Ministral 3's queries are scaled after RoPE"
        cos, sin, scale = rope
        q, k, v = super().project(query, key, value, (cos, sin), cache)
        return q * scale, k, v


def put_position_scaled_queries(model: nn.Module, cfg: CausalLMConfig) -> None:
    f = cfg.family
    assert f.query_scale_beta is not None and f.query_scale_positions is not None
    model.rotary = PositionScaledRotary(model.rotary, f.query_scale_beta, f.query_scale_positions)
    replace_layers(model, {f"layers.{i}.self_attn": layer.self_attn for i, layer in enumerate(model.layers)},
                   PositionScaledAttention)


# --- the family spec -------------------------------------------------------------------------------

def _query_scale(c: dict[str, Any]) -> FamilyConfig:
    """llama_4_scaling_beta and original_max_position_embeddings of rope_parameters (transformers
    reads both for every Ministral 3; a beta of 0 scales nothing)."""
    key = "rope_parameters" if c.get("rope_parameters") else "rope_scaling"
    params = c.get(key) or {}
    for needed in ("llama_4_scaling_beta", "original_max_position_embeddings"):
        if params.get(needed) is None:
            unsupported(c, key, params, f"Ministral 3 scales its queries by position: {needed!r} is needed")
    beta = float(params["llama_4_scaling_beta"])
    positions = int(params["original_max_position_embeddings"])
    return FamilyConfig(query_scale_beta=beta or None, query_scale_positions=positions if beta else None)


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    silu_only(c)
    return rope_decoder(c, ("default", "yarn"), family=_query_scale(c), norm_eps=c.get("rms_norm_eps", 1e-5),
                        **window_settings(c, c.get("sliding_window")))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    f = cfg.family
    rope = {**rope_parameters_keys(cfg), "llama_4_scaling_beta": f.query_scale_beta or 0.0,
            "original_max_position_embeddings": f.query_scale_positions or cfg.max_positions}
    return {**rope_decoder_keys(cfg, rope_scaling=False), "rope_parameters": rope,
            "sliding_window": cfg.sliding_window}


def problems(cfg: CausalLMConfig) -> list[str]:
    """YaRN's original context and the query scale's are one key in config.json."""
    s, positions = cfg.rope_scaling, cfg.family.query_scale_positions
    if isinstance(s, YarnRopeScaling) and positions is not None and s.original_max_positions != positions:
        return [f"query_scale_positions={positions} with YaRN's original_max_positions="
                f"{s.original_max_positions} (Ministral 3 reads both from original_max_position_embeddings)"]
    return []


# --- llama.cpp's mistral3 ----------------------------------------------------------------------------
# Llama's tensors and adjacent-pair RoPE, YaRN (families/gguf_yarn.py), and the query scale: its beta
# in {arch}.attention.temperature_scale (0: none), over YaRN's original context
# ({arch}.rope.scaling.original_context_length; without the key, the context length).

_TEMPERATURE = "mistral3.attention.temperature_scale"
_ORIGINAL = "mistral3.rope.scaling.original_context_length"


def write_keys(writer: Any, cfg: CausalLMConfig) -> None:
    """YaRN's keys, and the query scale's (convert_hf_to_gguf.py writes the beta always, 0 for none)."""
    write_yarn(writer, cfg)
    f = cfg.family
    writer.add_attn_temperature_scale(f.query_scale_beta or 0.0)
    if f.query_scale_positions is not None and not isinstance(cfg.rope_scaling, YarnRopeScaling):
        writer.add_rope_scaling_orig_ctx_len(f.query_scale_positions)  # YaRN writes its own


def read_keys(metadata: dict[str, Any], settings: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_scaling": read_yarn(metadata, "mistral3", settings["max_positions"], where)}
    beta = metadata.get(_TEMPERATURE) or 0.0
    if beta:
        positions = metadata.get(_ORIGINAL, settings["max_positions"])
        out["family"] = FamilyConfig(query_scale_beta=beta, query_scale_positions=positions)
    return out


def gguf_problems(cfg: CausalLMConfig) -> list[str]:
    return problems(cfg) + yarn_problems(cfg, "Ministral 3")


GGUF = GgufEntry("mistral3", "ministral3", "Ministral 3", llama.GGUF_TENSORS,
                 {**llama.GGUF_BLOCK, **llama.NO_BIASES, "sliding_window": llama.NO_WINDOW_IN_LLAMA_CPP},
                 rope="pairs", rope_freqs=True, biases=(), writes=frozenset({"query_scale_beta"}),
                 code=GgufCode(write=write_keys, read=read_keys, problems=gguf_problems, reads=READ_HERE,
                               rope_scalings=(YarnRopeScaling,)))

MINISTRAL3 = FamilySpec(
    model_type="ministral3", name="Ministral 3", hf_class="Ministral3ForCausalLM",
    fixed={**llama.LLAMA_BLOCK, **llama.NO_BIASES},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=llama.TENSORS, problems=problems,
    rope_scalings=(YarnRopeScaling,), may_set=frozenset({"query_scale_beta"}),
    claims=((28, lambda c: c.family.query_scale_beta is not None),),
    variants=("PositionScaledRotary", "PositionScaledAttention"),
    gguf=GGUF,
    differences=Differences(positions="YaRN", cache="a sliding window on every layer when set",
                            attention="queries scaled by their position (llama_4_scaling_beta)"))

__all__ = ["MINISTRAL3", "PositionScaledAttention", "PositionScaledRotary", "put_position_scaled_queries"]
