"""SmolLM3: Llama's block and tensor names, tied, with no RoPE in the layers `no_rope_layers`
marks 0 (every fourth: "NoPE"), and Qwen's sliding-window keys. `NoRopeAttention` is its variant."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.adopt import adopt_attention
from handformer.families.hf_config import qwen_window_keys, qwen_windows, rope_decoder_keys
from handformer.families.spec import Differences, FamilySpec, GgufEntry
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.kv_cache import NO_CACHE, LayerCache


class NoRopeAttention(MultiHeadAttention):
    """Attention without rotary positions, in a model whose other layers have them (SmolLM3's
    every fourth layer, "NoPE"): the causal mask alone tells it the order. Only `project` differs."""

    def __init__(self, attn: MultiHeadAttention) -> None:
        adopt_attention(self, attn)

    def project(self, query: Tensor, key: Tensor, value: Tensor, rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerCache = NO_CACHE) -> tuple[Tensor, Tensor, Tensor]:
        return super().project(query, key, value, None, cache)  # the rotation is not applied


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    """SmolLM3: Llama's block, tied, without RoPE in the layers no_rope_layers marks 0 (every fourth)."""
    use_rope = c.get("no_rope_layers") or []
    return dataclasses.replace(llama.from_hf_config(c), **qwen_windows(c),
                               nope_layers=[i for i, used in enumerate(use_rope) if not used])


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    return {**rope_decoder_keys(cfg), **qwen_window_keys(cfg), "attention_bias": cfg.bias,
        "mlp_bias": cfg.bias,
            "no_rope_layers": [0 if i in cfg.family.nope_layers else 1 for i in range(cfg.n_layers)]}


GGUF = GgufEntry("smollm3", "smollm3", "SmolLM3", llama.GGUF_TENSORS,
                 {**llama.GGUF_BLOCK, **llama.NO_BIASES, "sliding_window": llama.NO_WINDOW,
                  "rope_scaling": llama.NO_SCALING_IN_LLAMA_CPP},
                 rope="pairs", biases=(), nope_step=4, writes=frozenset({"nope_layers"}))

SMOLLM3 = FamilySpec(
    model_type="smollm3", name="SmolLM3", hf_class="SmolLM3ForCausalLM", fixed=llama.LLAMA_BLOCK,
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=llama.TENSORS, gguf=GGUF,
    may_set=frozenset({"global_layers", "nope_layers"}), hf_keys=frozenset({"no_rope_layers"}),
        layer_types=True,
    # layers without RoPE; else Llama's block whose layer_types mix sliding and global layers
    claims=((40, lambda c: bool(c.family.nope_layers)), (90, lambda c: bool(c.global_layers))),
    variants=("NoRopeAttention",), differences=Differences(positions="no RoPE in every fourth layer (NoPE)"))

__all__ = ["NoRopeAttention", "SMOLLM3"]
