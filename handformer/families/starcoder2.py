"""StarCoder2: Llama's block with LayerNorm, a plain (not gated) MLP with the tanh GELU, biases
everywhere (use_bias), a tied head and a sliding window on every layer when set. Only settings and
tensor names differ from Llama: the MLP is c_fc and c_proj, and each norm has a bias."""

from __future__ import annotations

from typing import Any

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.hf_config import rope_decoder, rope_decoder_keys, unsupported, window_settings
from handformer.families.spec import Differences, FamilySpec, to

_NAMES = {"mlp.c_fc": "ffn.up_proj", "mlp.c_proj": "ffn.down_proj",  # (F, D), (D, F)
          "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}  # (D,) each, with biases
TENSORS = llama.llama_like(llama.linears({**llama.ATTENTION, **_NAMES}), {"model.norm.bias": to("norm.bias")})


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    tied = c.get("tie_word_embeddings", True)
    if c.get("hidden_act", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu_new"):
        unsupported(c, "hidden_act", c["hidden_act"], "StarCoder2's MLP uses the tanh GELU in handformer")
    return rope_decoder(c, norm="layernorm", activation="gelu_tanh", bias=bool(c.get("use_bias", True)),
                        norm_eps=c.get("norm_epsilon", 1e-5), tie_embeddings=tied,
                        max_positions=c.get("max_position_embeddings", 4096),
                        **window_settings(c, c.get("sliding_window")))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    return {**rope_decoder_keys(cfg), "hidden_act": "gelu_pytorch_tanh", "norm_epsilon": cfg.norm_eps,
            "use_bias": cfg.bias, "sliding_window": cfg.sliding_window, "residual_dropout": 0.0,
            "embedding_dropout": 0.0}


STARCODER2 = FamilySpec(
    model_type="starcoder2", name="StarCoder2", hf_class="Starcoder2ForCausalLM",
    fixed={"norm": ("layernorm", "uses LayerNorm"), "scale_embeddings": llama.NO_SCALE,
           "activation": ("gelu_tanh", "has a GELU MLP with the tanh GELU"),
           "qkv_bias": (False, "has one bias setting for every layer")},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=TENSORS,
    claims=((85, lambda c: c.norm == "layernorm" and c.activation == "gelu_tanh"),),
    differences=Differences(norm="LayerNorm", attention="biases", ffn="a GELU MLP (c_fc, c_proj), biases",
                            cache="a sliding window when set"))

__all__ = ["STARCODER2"]
