"""Mistral: Llama's block and tensor names with sliding-window attention on every layer when
config.json sets sliding_window (null: none). llama.cpp runs it as its Llama (without a window)."""

from __future__ import annotations

from typing import Any

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.hf_config import rope_decoder, rope_decoder_keys, silu_only, window_settings
from handformer.families.spec import Differences, FamilySpec


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """Mistral: sliding-window attention when sliding_window is set (null: none)."""
    silu_only(c)
    return rope_decoder(c, **window_settings(c, c.get("sliding_window")))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    return {**rope_decoder_keys(cfg), "sliding_window": cfg.sliding_window}


MISTRAL = FamilySpec(
    model_type="mistral", name="Mistral", hf_class="MistralForCausalLM",
    fixed={**llama.LLAMA_BLOCK, **llama.NO_BIASES},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=llama.TENSORS, gguf=llama.GGUF,
    claims=((100, lambda c: c.sliding_window is not None),),
    differences=Differences(cache="a sliding window on every layer"))

__all__ = ["MISTRAL"]
