"""Hunyuan dense (Hunyuan 0.5B-7B, `hunyuan_v1_dense`): Llama's block with RMSNorm on each query and
key head *after* RoPE (Qwen3 norms them before): `RotatedQKNormAttention` is its variant. Its RoPE
is NTK-aware with a fixed alpha ("dynamic" with `alpha`), which only stretches the base:
theta * alpha^(Dh / (Dh - 2)); handformer reads it as that base.

Shape legend: B batch, T query length, S key length, H heads, Hkv key/value heads, Dh head dim.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.adopt import adopt_attention
from handformer.families.hf_config import (
    no_attention_bias,
    require,
    rope_decoder,
    rope_decoder_keys,
    silu_only,
    unsupported,
)
from handformer.families.spec import Differences, FamilySpec, GgufEntry
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.kv_cache import NO_CACHE, LayerCache
from handformer.nn.norms import make_norm
from handformer.nn.positions import apply_rotary


class RotatedQKNormAttention(MultiHeadAttention):
    """`MultiHeadAttention` whose queries and keys are turned by RoPE first and then each head
    normalized (RMSNorm over its Dh dims). Only `project` differs."""

    def __init__(self, attn: MultiHeadAttention, cfg: CausalLMConfig) -> None:
        adopt_attention(self, attn)  # then norms per head, applied after the rotation
        self.q_norm = make_norm(cfg.norm, self.head_dim, cfg.norm_eps)  # (Dh,)
        self.k_norm = make_norm(cfg.norm, self.head_dim, cfg.norm_eps)  # (Dh,)

    def project(self, query: Tensor, key: Tensor, value: Tensor, rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerCache = NO_CACHE) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V split into heads; Q and K turned by RoPE, then each head normalized."""
        q = self.split_heads(self.q_proj(query), self.n_heads)  # (B, T, H*Dh) -> (B, H, T, Dh)
        k = self.split_heads(self.k_proj(key), self.n_kv_heads)  # (B, Hkv, S, Dh)
        v = self.split_heads(self.v_proj(value), self.n_kv_heads)  # (B, Hkv, S, Dh)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        return self.q_norm(q), self.k_norm(k), v


def _rope_base(c: dict[str, Any]) -> dict[str, Any]:
    """NTK-aware RoPE with a fixed alpha is plain RoPE of base theta * alpha^(Dh / (Dh - 2)), as
    transformers computes it; "dynamic" without alpha changes with the length and is refused."""
    params = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    if params.get("rope_type", params.get("type")) != "dynamic":
        return c
    if not params.get("alpha"):
        unsupported(c, "rope_parameters", params, "dynamic NTK RoPE without a fixed alpha is not implemented")
    dim = c.get("head_dim") or require(c, "hidden_size") // require(c, "num_attention_heads")
    theta = params.get("rope_theta", c.get("rope_theta", 10000.0)) * params["alpha"] ** (dim / (dim - 2))
    return {**c, "rope_scaling": None, "rope_parameters": {"rope_type": "default", "rope_theta": theta}}


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    silu_only(c)
    no_attention_bias(c)
    return rope_decoder(_rope_base(c), qk_norm="head_after_rope", norm_eps=c.get("rms_norm_eps", 1e-5))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    return {**rope_decoder_keys(cfg), "attention_bias": False}


_NORMS = llama.norms({"self_attn.query_layernorm": "self_attn.q_norm",  # (Dh,) each
                      "self_attn.key_layernorm": "self_attn.k_norm"})
_AFTER_ROPE = ("head_after_rope", "normalises each query and key head after RoPE")

HUNYUAN_DENSE = FamilySpec(
    model_type="hunyuan_v1_dense", name="Hunyuan", hf_class="HunYuanDenseV1ForCausalLM",
    fixed={**llama.LLAMA_BLOCK, **llama.NO_BIASES, "sliding_window": llama.NO_WINDOW, "qk_norm": _AFTER_ROPE},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config,
    tensors=llama.llama_like(llama.linears({**llama.ATTENTION, **llama.MLP}), _NORMS, llama.PRE_NORMS),
    gguf=GgufEntry("hunyuan-dense", "hunyuan_v1_dense", "Hunyuan",
                   {**llama.GGUF_TENSORS, **llama.GGUF_QK_NORMS},  # norms (Dh,) each, after RoPE
                   {**llama.GGUF_BLOCK, **llama.NO_BIASES, "qk_norm": _AFTER_ROPE,
                    "sliding_window": llama.NO_WINDOW, "rope_scaling": llama.NO_SCALING_IN_LLAMA_CPP},
                   biases=(), writes=frozenset({"qk_norm"})),
    may_set=frozenset({"qk_norm"}), variants=("RotatedQKNormAttention",),
    claims=((61, lambda c: c.qk_norm == "head_after_rope"),),
    differences=Differences(positions="NTK-aware base (alpha)", attention="q/k norms per head, after RoPE"))

__all__ = ["HUNYUAN_DENSE", "RotatedQKNormAttention"]
