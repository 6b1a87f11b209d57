"""Qwen2/2.5, Qwen3 and their mixtures of experts: Llama's block and tensor names, with Qwen's
sliding window (use_sliding_window, max_window_layers or layer_types).

- Qwen2: biases on q, k, v only.
- Qwen3: RMSNorm on each query and key head before RoPE, no biases.
- Qwen3-MoE: Qwen3's attention with a mixture of experts moe_intermediate_size wide.
- Qwen2-MoE: Qwen2's attention with experts and a shared expert behind a sigmoid gate.
"""

from __future__ import annotations

from typing import Any

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.hf_config import (
    expert_keys,
    expert_width,
    experts,
    no_attention_bias,
    qwen_window_keys,
    qwen_windows,
    require,
    rope_decoder,
    rope_decoder_keys,
    silu_only,
    window_settings,
)
from handformer.families.mixtral import (
    EXPERT_KEYS,
    EXPERTS,
    GGUF_EXPERTS,
    ROUTER,
    STACKED_EXPERTS,
    dense_free,
    expert_problems,
)
from handformer.families.spec import Differences, FamilySpec, GgufEntry, to

_LLAMA_CPP = {"sliding_window": llama.NO_WINDOW_IN_LLAMA_CPP, "rope_scaling": llama.NO_SCALING_IN_LLAMA_CPP}
_QWEN3 = {**llama.LLAMA_BLOCK, **llama.NO_BIASES, "qk_norm": llama.HEAD_QK_NORM}


def _qwen2(c: dict[str, Any]) -> CausalLMConfig:
    """Qwen2/2.5: biases on q, k, v only; the Qwen sliding window."""
    silu_only(c)
    return rope_decoder(c, qkv_bias=True, **qwen_windows(c))


def _qwen3(c: dict[str, Any]) -> CausalLMConfig:
    """Qwen3 (dense): RMSNorm on each query and key head before RoPE, no biases."""
    silu_only(c)
    no_attention_bias(c)
    return rope_decoder(c, qk_norm="head", **qwen_windows(c))


def _dense_keys(cfg: CausalLMConfig) -> dict[str, Any]:  # Qwen3: attention_bias False (checked)
    return {**rope_decoder_keys(cfg), **qwen_window_keys(cfg), "attention_bias": False}


QWEN2 = FamilySpec(
    model_type="qwen2", name="Qwen2", hf_class="Qwen2ForCausalLM", fixed={**llama.LLAMA_BLOCK,
        **llama.QKV_BIAS_ONLY},
    from_hf_config=_qwen2, to_hf_config=_dense_keys, tensors=llama.TENSORS,
    gguf=GgufEntry("qwen2", "qwen2", "Qwen2", llama.GGUF_TENSORS,
                   {**llama.GGUF_BLOCK, "bias": llama.QKV_BIAS_ONLY["bias"], **_LLAMA_CPP},
                   full_width_heads=True, pre_tokenizer="qwen2"),
    may_set=frozenset({"global_layers"}), layer_types=True, gguf_fallback=True,
    claims=((80, lambda c: c.qkv_bias and not c.bias),),
    differences=Differences(attention="biases on q, k, v", cache="sliding layers when asked"))

QWEN3 = FamilySpec(
    model_type="qwen3", name="Qwen3", hf_class="Qwen3ForCausalLM", fixed=_QWEN3,
    from_hf_config=_qwen3, to_hf_config=_dense_keys, tensors=llama.TENSORS,
    gguf=GgufEntry("qwen3", "qwen3", "Qwen3", {**llama.GGUF_TENSORS, **llama.GGUF_QK_NORMS},
                   {**llama.GGUF_BLOCK, **llama.NO_BIASES, "qk_norm": llama.HEAD_QK_NORM, **_LLAMA_CPP},
                   biases=(), writes=frozenset({"qk_norm"})),
    may_set=frozenset({"qk_norm", "global_layers"}), layer_types=True,
    claims=((60, lambda c: c.qk_norm == "head"),),
    differences=Differences(attention="q/k norms per head", cache="sliding layers when asked"))


def _moe_keys(cfg: CausalLMConfig) -> dict[str, Any]:
    assert cfg.moe is not None
    return {**rope_decoder_keys(cfg), **expert_keys(cfg), "moe_intermediate_size": expert_width(cfg),
            "norm_topk_prob": cfg.moe.normalize, "decoder_sparse_step": 1, "mlp_only_layers": []}


def _qwen3_moe(c: dict[str, Any]) -> CausalLMConfig:
    """Qwen3-MoE: Qwen3's attention with a mixture of experts (moe_intermediate_size wide); the top-k
    weights renormalized when norm_topk_prob."""
    silu_only(c)
    no_attention_bias(c)
    moe = experts(c, require(c, "moe_intermediate_size"), c.get("norm_topk_prob", False))
    window = c.get("sliding_window") if c.get("use_sliding_window", False) else None
    return rope_decoder(c, qk_norm="head", moe=moe, **window_settings(c, window))


def _qwen3_moe_keys(cfg: CausalLMConfig) -> dict[str, Any]:
    window = cfg.sliding_window
    return {**_moe_keys(cfg), "use_sliding_window": window is not None, "sliding_window": window,
            "attention_bias": False}


MOE_TENSORS = llama.llama_like(llama.linears(llama.ATTENTION), llama.QK_NORMS, llama.PRE_NORMS, ROUTER,
    EXPERTS,
                               in_memory=STACKED_EXPERTS)
QWEN3_MOE = FamilySpec(
    model_type="qwen3_moe", name="Qwen3-MoE", hf_class="Qwen3MoeForCausalLM", fixed=_QWEN3,
    from_hf_config=_qwen3_moe, to_hf_config=_qwen3_moe_keys, tensors=MOE_TENSORS,
    # each layer's experts stacked into one 3-D tensor per projection, the top-k weights always rescaled
    gguf=GgufEntry("qwen3moe", "qwen3_moe", "Qwen3-MoE",
                   {**dense_free({**llama.GGUF_TENSORS, **llama.GGUF_QK_NORMS}), **GGUF_EXPERTS},
                   QWEN3.gguf.settings if QWEN3.gguf else {}, biases=(), experts=True,
                   writes=frozenset({"qk_norm", "moe"})),
    may_set=frozenset({"qk_norm", "moe"}), hf_keys=EXPERT_KEYS,
    problems=lambda cfg: expert_problems(cfg, "Qwen3-MoE", shared=False),
    claims=((11, lambda c: c.moe is not None and c.qk_norm == "head"),),
    differences=Differences(attention="q/k norms per head", ffn="a mixture of experts"))


def _qwen2_moe(c: dict[str, Any]) -> CausalLMConfig:
    """Qwen2-MoE: Qwen2's attention (q/k/v biases) with experts and a shared expert behind a sigmoid gate."""
    silu_only(c)
    moe = experts(c, require(c, "moe_intermediate_size"), c.get("norm_topk_prob", False),
                  require(c, "shared_expert_intermediate_size"))
    return rope_decoder(c, qkv_bias=True, moe=moe, **qwen_windows(c))


def _qwen2_moe_keys(cfg: CausalLMConfig) -> dict[str, Any]:
    assert cfg.moe is not None
    return {**_moe_keys(cfg), "shared_expert_intermediate_size": cfg.moe.d_shared, "qkv_bias": True,
            **qwen_window_keys(cfg)}


QWEN2_MOE = FamilySpec(
    model_type="qwen2_moe", name="Qwen2-MoE", hf_class="Qwen2MoeForCausalLM",
    fixed={**llama.LLAMA_BLOCK, **llama.QKV_BIAS_ONLY}, from_hf_config=_qwen2_moe,
        to_hf_config=_qwen2_moe_keys,
    # a shared expert every token goes through, scaled by a sigmoid gate
    tensors=llama.llama_like(llama.linears(llama.ATTENTION), llama.PRE_NORMS, ROUTER, EXPERTS, {
        **{f"model.layers.{{i}}.mlp.shared_expert.{p}.weight":
           to(f"layers.{{i}}.ffn.shared_expert.expert.{p}.weight")
           for p in ("gate_proj", "up_proj", "down_proj")},
        "model.layers.{i}.mlp.shared_expert_gate.weight": to("layers.{i}.ffn.shared_expert.gate.weight")},
        in_memory=STACKED_EXPERTS),
    may_set=frozenset({"moe", "global_layers"}), hf_keys=EXPERT_KEYS, layer_types=True,
    problems=lambda cfg: expert_problems(cfg, "Qwen2-MoE", shared=True),
    claims=((10, lambda c: c.moe is not None and c.moe.d_shared > 0),),
    gguf_unread={"qwen2moe": "Qwen2-MoE has a mixture of experts and a shared expert"},
    differences=Differences(attention="biases on q, k, v", ffn="a mixture of experts and a shared expert"))

__all__ = ["MOE_TENSORS", "QWEN2", "QWEN2_MOE", "QWEN3", "QWEN3_MOE"]
