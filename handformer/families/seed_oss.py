"""Seed-OSS (ByteDance Seed-OSS-36B): Llama's block and tensor names with biases on q, k and v
(attention_bias) and none on the output projection (attention_out_bias) or the MLP (mlp_bias),
as Qwen2. Only settings differ from Llama; llama.cpp names the FFN's norm post_attention_norm."""

from __future__ import annotations

from typing import Any

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.hf_config import rope_decoder, rope_decoder_keys, silu_only, unsupported
from handformer.families.spec import Differences, FamilySpec, GgufEntry

# (attention_bias, attention_out_bias, mlp_bias) -> handformer's (bias, qkv_bias)
_BIASES = {(True, False, False): (False, True), (False, False, False): (False, False),
           (True, True, True): (True, False)}


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    silu_only(c)
    found = tuple(bool(c.get(k, d)) for k, d in
                  (("attention_bias", True), ("attention_out_bias", False), ("mlp_bias", False)))
    if found not in _BIASES:
        unsupported(c, "attention_bias, attention_out_bias, mlp_bias", found, "handformer has biases on "
                    "q/k/v only, on every linear layer or on none")
    bias, qkv_bias = _BIASES[found]
    return rope_decoder(c, bias=bias, qkv_bias=qkv_bias)


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    qkv = cfg.bias or cfg.qkv_bias
    return {**rope_decoder_keys(cfg), "attention_bias": qkv, "attention_out_bias": cfg.bias,
            "mlp_bias": cfg.bias, "residual_dropout": 0.0}


GGUF = GgufEntry("seed_oss", "seed_oss", "Seed-OSS", {
    **{name: keys for name, keys in llama.GGUF_TENSORS.items() if name != "blk.{i}.ffn_norm.weight"},
    "blk.{i}.post_attention_norm.weight": ("layers.{i}.ffn_norm.weight",)},  # (D,): the FFN's input norm
    {**llama.GGUF_BLOCK, "sliding_window": llama.NO_WINDOW, "rope_scaling": llama.NO_SCALING_IN_LLAMA_CPP})

SEED_OSS = FamilySpec(
    model_type="seed_oss", name="Seed-OSS", hf_class="SeedOssForCausalLM",
    fixed={**llama.LLAMA_BLOCK, "sliding_window": llama.NO_WINDOW},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=llama.TENSORS, gguf=GGUF,
    # a run trained here with Seed-OSS's settings is a Qwen2 or a Llama: it comes here only by
    # the model_type an import recorded
    differences=Differences(attention="biases on q, k, v (attention_bias)"))

__all__ = ["SEED_OSS"]
