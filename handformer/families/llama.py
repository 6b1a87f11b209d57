"""Llama: the lineage most families here descend from, and the names they share.

The lesson's pre-norm block with RMSNorm, rotary positions (half-split, as Hugging Face stores
q/k, so no permutation on import) and a SwiGLU MLP; grouped-query attention, a tied or untied
head, Llama 3's or linear rope scaling. Llama 2/3.x, SmolLM and SmolLM2 are this family.

What the descendants share lives here once: the Hugging Face tensor names (`linears`, `norms`,
`llama_like`), llama.cpp's tensor names (`GGUF_TENSORS` and its parts), and the statements of what
an architecture fixes (`LLAMA_BLOCK`, `NO_BIASES`, ...), read by export-hf and export-gguf alike.
"""

from __future__ import annotations

from typing import Any

from handformer.config import CausalLMConfig
from handformer.families.hf_config import rope_decoder, rope_decoder_keys, silu_only, unsupported
from handformer.families.spec import Differences, FamilySpec, Fixed, GgufEntry, HFTensors, Target, to

HEAD = "lm_head.weight"  # the output head's key, in Hugging Face and in handformer alike
ATTN, FFN = "layers.{i}.self_attn", "layers.{i}.ffn"

# --- what an architecture fixes: (value, why), stated once --------------------------------------
PRE_NORM = ("pre", "is pre-norm")
NO_SCALE = (False, "does not scale embeddings by sqrt(d_model)")
RMSNORM = ("rmsnorm", "uses RMSNorm")
SWIGLU = ("swiglu", "has a SwiGLU MLP")
NO_BIAS = (False, "has no biases")
NO_WINDOW = (None, "has no sliding-window attention")
HEAD_QK_NORM = ("head", "normalises each query and key head")
WIDTH_QK_NORM = ("width", "normalises queries and keys over their whole width")
QKV_BIAS_ONLY = {"bias": (False, "has biases on q/k/v only"), "qkv_bias": (True, "always has q/k/v biases")}
NO_BIASES: Fixed = {"bias": NO_BIAS, "qkv_bias": NO_BIAS}
LLAMA_BLOCK: Fixed = {"norm": RMSNORM, "activation": SWIGLU, "scale_embeddings": NO_SCALE}
# llama.cpp's view adds what Hugging Face's exporter checks for every family
GGUF_BLOCK: Fixed = {"norm_placement": PRE_NORM, "scale_embeddings": NO_SCALE,
                     "position": ("rope", "has rotary positions"), "norm": RMSNORM, "activation": SWIGLU}
NO_WINDOW_IN_LLAMA_CPP = (None, "has no sliding-window attention in llama.cpp")
NO_SCALING_IN_LLAMA_CPP = (None, "reads no Llama 3 rope scaling in llama.cpp")

# --- Hugging Face tensor names --------------------------------------------------------------------
ATTENTION = {
    "self_attn.q_proj": "self_attn.q_proj",  # (H*Dh, D)
    "self_attn.k_proj": "self_attn.k_proj",  # (Hkv*Dh, D)
    "self_attn.v_proj": "self_attn.v_proj",  # (Hkv*Dh, D)
    "self_attn.o_proj": "self_attn.o_proj",  # (D, H*Dh)
}
MLP = {
    "mlp.gate_proj": "ffn.gate_proj",  # (F, D)
    "mlp.up_proj": "ffn.up_proj",  # (F, D)
    "mlp.down_proj": "ffn.down_proj",  # (D, F)
}


def linears(names: dict[str, str]) -> dict[str, Target]:
    """Weight and bias of each linear layer (biases are expected only where the model has them)."""
    return {f"model.layers.{{i}}.{hf}.{p}": to(f"layers.{{i}}.{ours}.{p}") for hf, ours in names.items()
            for p in ("weight", "bias")}


def norms(names: dict[str, str]) -> dict[str, Target]:
    return {f"model.layers.{{i}}.{hf}.weight": to(f"layers.{{i}}.{ours}.weight") for hf,
        ours in names.items()}


# q/k norms: (Dh,) per head (Qwen3, Gemma 3), (H*Dh,) and (Hkv*Dh,) over the width (OLMo 2, OLMoE).
QK_NORMS = norms({"self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm"})
PRE_NORMS = norms({"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"})
_ENDS = {"model.embed_tokens.weight": to("embed.weight"), "model.norm.weight": to("norm.weight"),
         HEAD: to("lm_head.weight")}
# RoPE frequencies, recomputed from rope_theta; saved as buffers by older transformers versions.
_ROTARY_BUFFERS = ("model.layers.{i}.self_attn.rotary_emb.inv_freq", "model.rotary_emb.inv_freq")


def llama_like(*parts: dict[str, Target], **more: Any) -> HFTensors:
    """A checkpoint named as Llama's is: the ends (embedding, final norm, head) and `parts`."""
    weights = {k: v for part in parts for k, v in part.items()}
    return HFTensors({**_ENDS, **weights}, _ROTARY_BUFFERS, "model.", "model.embed_tokens.weight", **more)


# q/k norms are mapped too, for the families that have them (Qwen3); a model without them has no
# such keys to fill, so a checkpoint that carries them is refused as unexpected.
TENSORS = llama_like(linears({**ATTENTION, **MLP}), QK_NORMS, PRE_NORMS)

# --- llama.cpp tensor names -----------------------------------------------------------------------


def with_bias(gguf_name: str, *keys: str) -> dict[str, tuple[str, ...]]:
    """A Linear's weight and bias: {"X.weight": (k.weight, ...), "X.bias": (k.bias, ...)}."""
    return {f"{gguf_name}.{p}": tuple(f"{k}.{p}" for k in keys) for p in ("weight", "bias")}


GGUF_ENDS = {
    "token_embd.weight": ("embed.weight",),  # (V, D)
    "output_norm.weight": ("norm.weight",),
    "output.weight": ("lm_head.weight",),  # (V, D); absent when tied
}
GGUF_NORMS = {
    "blk.{i}.attn_norm.weight": ("layers.{i}.attn_norm.weight",),
    "blk.{i}.ffn_norm.weight": ("layers.{i}.ffn_norm.weight",),
}
GGUF_TENSORS = {
    **GGUF_ENDS, **GGUF_NORMS,
    **with_bias("blk.{i}.attn_q", f"{ATTN}.q_proj"),  # (H*Dh, D)
    **with_bias("blk.{i}.attn_k", f"{ATTN}.k_proj"),  # (Hkv*Dh, D)
    **with_bias("blk.{i}.attn_v", f"{ATTN}.v_proj"),  # (Hkv*Dh, D)
    **with_bias("blk.{i}.attn_output", f"{ATTN}.o_proj"),  # (D, H*Dh)
    **with_bias("blk.{i}.ffn_gate", f"{FFN}.gate_proj"),  # (F, D)
    **with_bias("blk.{i}.ffn_up", f"{FFN}.up_proj"),  # (F, D)
    **with_bias("blk.{i}.ffn_down", f"{FFN}.down_proj"),  # (D, F)
}
GGUF_QK_NORMS = {  # RMSNorm over each query / key head (Dh,), before RoPE
    "blk.{i}.attn_q_norm.weight": (f"{ATTN}.q_norm.weight",),
    "blk.{i}.attn_k_norm.weight": (f"{ATTN}.k_norm.weight",),
}

# --- the family -----------------------------------------------------------------------------------


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """Llama 2/3.x, and SmolLM/SmolLM2 (tied, 9 query / 3 key-value heads)."""
    silu_only(c)
    bias = c.get("attention_bias", False)
    if c.get("mlp_bias", False) != bias:
        unsupported(c, "mlp_bias", c.get("mlp_bias", False), f"handformer has one bias setting; it must "
                    f"equal attention_bias={bias!r}")
    return rope_decoder(c, bias=bool(bias))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    return {**rope_decoder_keys(cfg), "attention_bias": cfg.bias, "mlp_bias": cfg.bias}


def problems(cfg: CausalLMConfig) -> list[str]:
    if cfg.qkv_bias and not cfg.bias:
        return ["qkv_bias=True with bias=False (Llama's attention_bias also covers o_proj; "
                "Qwen2 has q/k/v biases only)"]
    return []


GGUF = GgufEntry("llama", "llama", "Llama", GGUF_TENSORS, {**GGUF_BLOCK, "sliding_window": NO_WINDOW},
                 rope="pairs", rope_freqs=True, tokenizer_model="llama")

LLAMA = FamilySpec(
    model_type="llama", name="Llama", hf_class="LlamaForCausalLM",
    fixed={**LLAMA_BLOCK, "sliding_window": (None, "has no sliding-window attention (Mistral has)")},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS, gguf=GGUF,
    problems=problems, claims=((110, lambda c: True),), gguf_fallback=True,
    differences=Differences())

__all__ = ["LLAMA"]
