"""GLM-4 (GLM-4-9B-0414, GLM-4-32B-0414, `glm4`): Llama's attention with biases on q, k and v, and
three differences, none of them a module of its own:

- four norms a block, as Gemma 2's: x = x + post_norm(f(pre_norm(x))) around attention and around
  the MLP (`SandwichBlock`, with plain RMSNorm here). The checkpoint calls them input_layernorm,
  post_self_attn_layernorm, post_attention_layernorm (the one *before* the MLP) and
  post_mlp_layernorm.
- RoPE on the first half of each head's dims (partial_rotary_factor 0.5), turning adjacent pairs
  (x0, y0, x1, y1, ...) as GPT-J does. Import reorders those rows of q_proj and k_proj to
  half-split order (the other half untouched, `paired`), export puts them back, and the lesson's
  partial RoPE runs unchanged.
- the MLP's gate and up projections fused in one gate_up_proj (rows gate, then up), split at
  import and joined at export, as Phi-3's.
"""

from __future__ import annotations

from typing import Any

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.hf_config import rope_decoder, rope_decoder_keys, silu_only
from handformer.families.spec import Differences, FamilySpec, GgufEntry, paired, to

ATTN, FFN = llama.ATTN, llama.FFN
_PAIRED = {f"model.layers.{{i}}.self_attn.{p}_proj.{w}": paired(f"{ATTN}.{p}_proj.{w}")
           for p in ("q", "k") for w in ("weight", "bias")}  # (H*Dh, D), (Hkv*Dh, D) and their biases
TENSORS = llama.llama_like(llama.linears({"self_attn.v_proj": "self_attn.v_proj",  # (Hkv*Dh, D)
                                          "self_attn.o_proj": "self_attn.o_proj"}), _PAIRED, {
    "model.layers.{i}.mlp.gate_up_proj.weight": to(f"{FFN}.gate_proj.weight",  # (2F, D) -> (F, D) each
                                                   f"{FFN}.up_proj.weight"),
    "model.layers.{i}.mlp.down_proj.weight": to(f"{FFN}.down_proj.weight"),  # (D, F)
}, llama.norms({"input_layernorm": "attn_norm", "post_self_attn_layernorm": "post_attn_norm",
                "post_attention_layernorm": "ffn_norm", "post_mlp_layernorm": "post_ffn_norm"}))
GGUF_TENSORS = {
    **{k: v for k, v in llama.GGUF_TENSORS.items() if ".ffn_gate." not in k and ".ffn_up." not in k},
    "blk.{i}.ffn_up.weight": (f"{FFN}.gate_proj.weight", f"{FFN}.up_proj.weight"),  # (2F, D)
    "blk.{i}.post_attention_norm.weight": ("layers.{i}.post_attn_norm.weight",),  # (D,)
    "blk.{i}.post_ffw_norm.weight": ("layers.{i}.post_ffn_norm.weight",),  # (D,)
}


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """GLM-4: norms before and after each sublayer, q/k/v biases (attention_bias), RoPE on the
    first partial_rotary_factor of each head (0.5 unless the config says otherwise)."""
    silu_only(c)
    params = c.get("rope_parameters") or {}
    fraction = params.get("partial_rotary_factor", c.get("partial_rotary_factor")) or 0.5
    return rope_decoder(c, ("default",), partial=True, norm_placement="sandwich", bias=False,
                        qkv_bias=bool(c.get("attention_bias", True)), rope_fraction=float(fraction),
                        norm_eps=c.get("rms_norm_eps", 1.5625e-07))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    return {**rope_decoder_keys(cfg), "attention_bias": cfg.qkv_bias,
            "partial_rotary_factor": cfg.rope_fraction}


SANDWICH = ("sandwich", "norms each sublayer's input and output")
_BLOCK = {**llama.LLAMA_BLOCK, "norm_placement": SANDWICH,
          "bias": (False, "has biases on q/k/v only, if any"), "sliding_window": llama.NO_WINDOW,
          "rope_scaling": (None, "turns RoPE without scaling in handformer")}

GLM4 = FamilySpec(
    model_type="glm4", name="GLM-4", hf_class="Glm4ForCausalLM", fixed=_BLOCK,
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS,
    # llama.cpp's GLM-4 turns adjacent pairs of the first rope.dimension_count dims, as the checkpoint
    gguf=GgufEntry("glm4", "glm4", "GLM-4", GGUF_TENSORS, {**llama.GGUF_BLOCK, **_BLOCK}, rope="pairs",
                   writes=frozenset({"rope_fraction"})),
    may_set=frozenset({"rope_fraction"}), hf_keys=frozenset({"partial_rotary_factor"}),
    claims=((19, lambda c: c.norm_placement == "sandwich" and c.norm == "rmsnorm"),),
    variants=("SandwichBlock",),
    differences=Differences(norm="before and after each sublayer", positions="RoPE on half of each head, "
                            "adjacent pairs (rows reordered on import)", attention="q/k/v biases",
                            ffn="fused gate/up in the checkpoint"))

__all__ = ["GLM4"]
