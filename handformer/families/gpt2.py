"""GPT-2: learned positions, LayerNorm, a GELU MLP, biases everywhere; the lesson's block as it is.

Its checkpoints store Linear layers as `Conv1D` with (in, out) weights (transposed on the way in
and out) and fuse q, k, v into one `c_attn`, split in q, k, v order.
"""

from __future__ import annotations

from typing import Any

from handformer.config import CausalLMConfig
from handformer.families.hf_config import require, unsupported
from handformer.families.spec import Differences, FamilySpec, GgufEntry, HFTensors, conv1d, to

HEAD = "lm_head.weight"  # the output head's key, in Hugging Face and in handformer alike
ATTN, FFN = "layers.{i}.self_attn", "layers.{i}.ffn"

TENSORS = HFTensors(
    weights={
        "transformer.wte.weight": to("embed.weight"),  # (V, D)
        "transformer.wpe.weight": to("positions.weight"),  # (P, D)
        "transformer.h.{i}.ln_1.weight": to("layers.{i}.attn_norm.weight"),
        "transformer.h.{i}.ln_1.bias": to("layers.{i}.attn_norm.bias"),
        "transformer.h.{i}.attn.c_attn.weight": conv1d(  # (D, 3D) -> 3 x (D, D)
            f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"),
        "transformer.h.{i}.attn.c_attn.bias": to(  # (3D,) -> 3 x (D,)
            f"{ATTN}.q_proj.bias", f"{ATTN}.k_proj.bias", f"{ATTN}.v_proj.bias"),
        "transformer.h.{i}.attn.c_proj.weight": conv1d(f"{ATTN}.o_proj.weight"),
        "transformer.h.{i}.attn.c_proj.bias": to(f"{ATTN}.o_proj.bias"),
        "transformer.h.{i}.ln_2.weight": to("layers.{i}.ffn_norm.weight"),
        "transformer.h.{i}.ln_2.bias": to("layers.{i}.ffn_norm.bias"),
        "transformer.h.{i}.mlp.c_fc.weight": conv1d(f"{FFN}.up_proj.weight"),  # (D, F)
        "transformer.h.{i}.mlp.c_fc.bias": to(f"{FFN}.up_proj.bias"),
        "transformer.h.{i}.mlp.c_proj.weight": conv1d(f"{FFN}.down_proj.weight"),  # (F, D)
        "transformer.h.{i}.mlp.c_proj.bias": to(f"{FFN}.down_proj.bias"),
        "transformer.ln_f.weight": to("norm.weight"),
        "transformer.ln_f.bias": to("norm.bias"),
        HEAD: to("lm_head.weight"),  # (V, D)
    },
    # The causal mask and the masking value, saved as buffers by older transformers versions.
    ignored=("transformer.h.{i}.attn.bias", "transformer.h.{i}.attn.masked_bias"),
    base_prefix="transformer.", embedding="transformer.wte.weight", zero_biases=True)

# Hugging Face's activation_function -> handformer's activation, and back
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
_EXPORTED = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    activation = c.get("activation_function", "gelu_new")
    if activation not in _ACTIVATIONS:
        unsupported(c, "activation_function", activation, f"handformer supports {', '.join(_ACTIVATIONS)}")
    if not c.get("scale_attn_weights", True):
        unsupported(c, "scale_attn_weights", False, "handformer always scales scores by 1/sqrt(Dh)")
    if c.get("scale_attn_by_inverse_layer_idx", False):
        unsupported(c, "scale_attn_by_inverse_layer_idx", True, "not implemented in handformer")
    if c.get("add_cross_attention", False):
        unsupported(c, "add_cross_attention", True, "CausalLM has no cross-attention")
    d_model = require(c, "n_embd")
    return CausalLMConfig.gpt2_style(
        vocab_size=require(c, "vocab_size"), d_model=d_model, n_heads=require(c, "n_head"),
        n_layers=require(c, "n_layer"), d_ff=c.get("n_inner") or 4 * d_model,
        max_positions=require(c, "n_positions"), norm_eps=c.get("layer_norm_epsilon", 1e-5),
        activation=_ACTIVATIONS[activation], tie_embeddings=c.get("tie_word_embeddings", True),
        dropout=0.0, attention_dropout=0.0)


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    return {"n_embd": cfg.d_model, "n_head": cfg.n_heads, "n_layer": cfg.n_layers,
            "n_inner": cfg.d_ff, "n_positions": cfg.max_positions,
            "layer_norm_epsilon": cfg.norm_eps, "activation_function": _EXPORTED[cfg.activation],
            "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.attention_dropout,
            "scale_attn_weights": True}


def problems(cfg: CausalLMConfig) -> list[str]:
    found = []
    if cfg.activation not in _EXPORTED:
        found.append(f"activation={cfg.activation!r} (GPT-2 supports {', '.join(_EXPORTED)})")
    if not cfg.derived_head_dim:
        found.append(f"head_dim={cfg.head_dim} (GPT-2's heads are d_model / n_heads wide)")
    return found


def _with_bias(gguf_name: str, *keys: str) -> dict[str, tuple[str, ...]]:
    """A Linear's weight and bias: {"X.weight": (k.weight, ...), "X.bias": (k.bias, ...)}."""
    return {f"{gguf_name}.{p}": tuple(f"{k}.{p}" for k in keys) for p in ("weight", "bias")}


_GGUF_TENSORS = {
    **_with_bias("token_embd", "embed"), "position_embd.weight": ("positions.weight",),  # (P, D)
    **_with_bias("output_norm", "norm"), "output.weight": ("lm_head.weight",),
    **_with_bias("blk.{i}.attn_norm", "layers.{i}.attn_norm"),
    **_with_bias("blk.{i}.attn_qkv", f"{ATTN}.q_proj", f"{ATTN}.k_proj", f"{ATTN}.v_proj"),  # (3D, D)
    **_with_bias("blk.{i}.attn_output", f"{ATTN}.o_proj"),
    **_with_bias("blk.{i}.ffn_norm", "layers.{i}.ffn_norm"),
    **_with_bias("blk.{i}.ffn_up", f"{FFN}.up_proj"),  # (F, D)
    **_with_bias("blk.{i}.ffn_down", f"{FFN}.down_proj"),  # (D, F)
}
del _GGUF_TENSORS["token_embd.bias"]  # the embedding has no bias
_NO_WINDOW = (None, "has no sliding-window attention")
_ONE_KV_HEAD = (None, "has one key/value head per query head")
GGUF = GgufEntry(
    "gpt2", "gpt2", "GPT-2", _GGUF_TENSORS,
    {"norm_placement": ("pre", "is pre-norm"), "scale_embeddings": (False, "does not scale embeddings"),
     "position": ("learned", "has learned positions"), "norm": ("layernorm", "uses LayerNorm"),
     "activation": ("gelu_tanh", "uses the tanh GELU in llama.cpp: train with activation='gelu_tanh', "
                    "GPT-2's own"),
     "n_kv_heads": _ONE_KV_HEAD, "sliding_window": _NO_WINDOW},
    rope=None, zero_biases=True, full_width_heads=True, tokenizer_model="gpt2")

GPT2 = FamilySpec(
    model_type="gpt2", name="GPT-2", hf_class="GPT2LMHeadModel",
    fixed={"norm": ("layernorm", "uses LayerNorm"),
           "scale_embeddings": (False, "does not scale embeddings by sqrt(d_model)"),
           "sliding_window": _NO_WINDOW, "n_kv_heads": _ONE_KV_HEAD},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS, gguf=GGUF,
    position="learned", problems=problems, residual_dropout=True,
    claims=((0, lambda c: c.position == "learned"),),
    differences=Differences(norm="LayerNorm", positions="learned", ffn="GELU MLP; biases",
                            attention="one key/value head a query head; biases",
                            embedding="Conv1D weights (in, out)"))

__all__ = ["GPT2", "HEAD"]
