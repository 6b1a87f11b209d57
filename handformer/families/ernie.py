"""ERNIE 4.5 (the dense 0.3B, `ernie4_5`): Llama's block, tied, with biases on every linear layer
when use_bias, and RoPE that turns adjacent pairs of each head's dims (x0, y0, x1, y1, ...), as
GPT-J and llama.cpp's Llama do, where Llama turns the two halves (x0, x1, ..., y0, y1, ...). The
two are the same rotation of reordered dims: import reorders the rows of q_proj and k_proj to
half-split order (`paired`), export puts them back, and handformer's RoPE runs unchanged."""

from __future__ import annotations

from typing import Any

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.hf_config import rope_decoder, rope_decoder_keys, silu_only
from handformer.families.spec import Differences, FamilySpec, GgufEntry, paired

_PAIRED = {f"model.layers.{{i}}.self_attn.{p}_proj.{w}": paired(f"layers.{{i}}.self_attn.{p}_proj.{w}")
           for p in ("q", "k") for w in ("weight", "bias")}  # (H*Dh, D), (Hkv*Dh, D) and their biases
TENSORS = llama.llama_like(llama.linears({**llama.ATTENTION, **llama.MLP}), _PAIRED, llama.PRE_NORMS)


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    silu_only(c)
    return rope_decoder(c, bias=bool(c.get("use_bias", False)), norm_eps=c.get("rms_norm_eps", 1e-5),
                        tie_embeddings=c.get("tie_word_embeddings", True))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    return {**rope_decoder_keys(cfg), "use_bias": cfg.bias}


ERNIE4_5 = FamilySpec(
    model_type="ernie4_5", name="ERNIE 4.5", hf_class="Ernie4_5ForCausalLM",
    fixed={**llama.LLAMA_BLOCK, "qkv_bias": (False, "has one bias setting (use_bias) for every layer"),
           "sliding_window": llama.NO_WINDOW},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS,
    # llama.cpp's ERNIE 4.5 turns adjacent pairs as its Llama does: the rows go back to pairs
    gguf=GgufEntry("ernie4_5", "ernie4_5", "ERNIE 4.5", llama.GGUF_TENSORS,
                   {**llama.GGUF_BLOCK, "sliding_window": llama.NO_WINDOW,
                    "rope_scaling": llama.NO_SCALING_IN_LLAMA_CPP}, rope="pairs"),
    # a run trained here turns halves: it comes here only by the model_type an import recorded
    differences=Differences(positions="RoPE on adjacent pairs (rows reordered on import)",
                            attention="biases when use_bias"))

__all__ = ["ERNIE4_5"]
