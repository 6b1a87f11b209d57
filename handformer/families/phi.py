"""Phi-3, Phi-3.5 and Phi-4-mini: Llama's block with fused projections, partial RoPE and LongRoPE.

Its checkpoints fuse q, k, v into `qkv_proj` (rows q, then k, then v) and the SwiGLU's gate and up
projections into `gate_up_proj` (rows gate, then up); both are split at import into handformer's
separate projections and joined again at export, so one model class serves every family.
"""

from __future__ import annotations

from typing import Any

import handformer.families.llama as llama
from handformer.config import CausalLMConfig, LongRopeScaling
from handformer.families.hf_config import rope_decoder, rope_decoder_keys, silu_only, window_settings
from handformer.families.spec import Differences, FamilySpec, GgufEntry, to

ATTN, FFN = llama.ATTN, llama.FFN
TENSORS = llama.llama_like(llama.PRE_NORMS, {
    "model.layers.{i}.self_attn.qkv_proj.weight": to(  # (H*Dh + 2*Hkv*Dh, D) -> q, k, v
        f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"),
    "model.layers.{i}.self_attn.o_proj.weight": to(f"{ATTN}.o_proj.weight"),
    "model.layers.{i}.mlp.gate_up_proj.weight": to(  # (2F, D) -> gate (F, D), up (F, D)
        f"{FFN}.gate_proj.weight", f"{FFN}.up_proj.weight"),
    "model.layers.{i}.mlp.down_proj.weight": to(f"{FFN}.down_proj.weight"),
})
GGUF_TENSORS = {
    **llama.GGUF_ENDS, **llama.GGUF_NORMS,
    "blk.{i}.attn_qkv.weight": (f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight",
                                f"{ATTN}.v_proj.weight"),  # (H*Dh + 2*Hkv*Dh, D)
    "blk.{i}.attn_output.weight": (f"{ATTN}.o_proj.weight",),
    "blk.{i}.ffn_up.weight": (f"{FFN}.gate_proj.weight", f"{FFN}.up_proj.weight"),  # (2F, D)
    "blk.{i}.ffn_down.weight": (f"{FFN}.down_proj.weight",),
}


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """Phi-3, Phi-3.5 and Phi-4-mini: Llama's block with fused projections (split by the weight map),
    rms_norm_eps 1e-5 by default, a sliding window when set; partial RoPE (partial_rotary_factor)
    and LongRoPE scaling."""
    silu_only(c)
    params = c.get("rope_parameters") or {}
    fraction = params.get("partial_rotary_factor", c.get("partial_rotary_factor")) or 1.0
    return rope_decoder(c, ("default", "longrope"), partial=True, norm_eps=c.get("rms_norm_eps", 1e-5),
                        rope_fraction=float(fraction), **window_settings(c, c.get("sliding_window")))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    # its config defaults original_max_position_embeddings to 4096 (import reads it first)
    original = cfg.rope_scaling.original_max_positions if cfg.rope_scaling else cfg.max_positions
    return {**rope_decoder_keys(cfg), "sliding_window": cfg.sliding_window,
        "original_max_position_embeddings": original,
            "partial_rotary_factor": cfg.rope_fraction, "resid_pdrop": 0.0, "embd_pdrop": 0.0}


PHI3 = FamilySpec(
    model_type="phi3", name="Phi-3", hf_class="Phi3ForCausalLM", fixed={**llama.LLAMA_BLOCK,
        **llama.NO_BIASES},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS,
    gguf=GgufEntry("phi3", "phi3", "Phi-3", GGUF_TENSORS, {**llama.GGUF_BLOCK, **llama.NO_BIASES},
                   writes_window=True, full_width_heads=True, biases=(), longrope=True,
                   writes=frozenset({"rope_fraction"})),
    may_set=frozenset({"rope_fraction"}), hf_keys=frozenset({"partial_rotary_factor"}),
    rope_scalings=(LongRopeScaling,),
    claims=((50, lambda c: c.rope_fraction != 1 or isinstance(c.rope_scaling, LongRopeScaling)),),
    look_alikes={"phi": "Phi-1/2 run attention and the MLP in parallel with LayerNorm and partial rotary "
                        "embeddings"},
    gguf_unread={"phi2": "Phi-2 runs attention and the feed-forward in parallel with partial rotary "
                         "embeddings"},
    differences=Differences(positions="partial RoPE; LongRoPE", attention="fused q/k/v in the checkpoint",
                            ffn="fused gate/up in the checkpoint", cache="a sliding window when set"))

__all__ = ["PHI3"]
