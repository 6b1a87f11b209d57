"""Apertus (Swiss AI's Apertus 8B and 70B): Llama's attention with RMSNorm on each query and key
head before RoPE (as Qwen3), and a feed-forward network that is not gated: down(xIELU(up(x))).
Its xIELU learns two numbers in every layer, alpha_p and alpha_n (stored before their softplus, as
the checkpoint holds them), beside two constants, beta and eps, that the checkpoint carries too:
`LearnedXIELU` is the variant that holds them in place of the lesson's `xielu` function.

Shape legend: B batch, T length, F hidden width.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import handformer.families.llama as llama
from handformer.config import CausalLMConfig
from handformer.families.hf_config import no_attention_bias, rope_decoder, rope_decoder_keys, unsupported
from handformer.families.spec import Differences, FamilySpec, GgufEntry, to
from handformer.nn.feed_forward import xielu


class LearnedXIELU(nn.Module):
    """xIELU with alpha_p = softplus(a_p) and alpha_n = beta + softplus(a_n), a_p and a_n learned
    (transformers' XIELUActivation); beta and eps are kept as the checkpoint stores them."""

    def __init__(self, alpha_p: float = 0.8, alpha_n: float = 0.8, beta: float = 0.5,
                 eps: float = -1e-6) -> None:
        super().__init__()
        inverse_softplus = lambda y: torch.tensor(y).expm1().log().reshape(1)  # noqa: E731
        self.alpha_p = nn.Parameter(inverse_softplus(alpha_p))  # (1,)
        self.alpha_n = nn.Parameter(inverse_softplus(alpha_n - beta))  # (1,)
        self.register_buffer("beta", torch.tensor(beta))  # ()
        self.register_buffer("eps", torch.tensor(eps))  # ()

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, F) -> (B, T, F)."""
        return xielu(x, F.softplus(self.alpha_p), self.beta + F.softplus(self.alpha_n), self.beta, self.eps)


def put_learned_xielu(model: nn.Module, cfg: CausalLMConfig) -> None:
    """Each layer's FFN activation becomes a `LearnedXIELU` of its own (layers.{i}.ffn.act)."""
    for layer in model.layers:
        layer.ffn.act = LearnedXIELU()


def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    if c.get("hidden_act", "xielu") != "xielu":
        unsupported(c, "hidden_act", c["hidden_act"], "Apertus's MLP is xIELU in handformer")
    no_attention_bias(c)
    if c.get("mlp_bias", False):
        unsupported(c, "mlp_bias", c["mlp_bias"], "Apertus has no MLP biases in handformer")
    return rope_decoder(c, activation="xielu", qk_norm="head", norm_eps=c.get("rms_norm_eps", 1e-5))


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    return {**rope_decoder_keys(cfg), "hidden_act": "xielu", "attention_bias": False}


_MLP = llama.linears({"mlp.up_proj": "ffn.up_proj", "mlp.down_proj": "ffn.down_proj"})  # (F, D), (D, F)
_XIELU = {f"model.layers.{{i}}.mlp.act_fn.{name}": to(f"layers.{{i}}.ffn.act.{name}")
          for name in ("alpha_p", "alpha_n", "beta", "eps")}  # (1,), (1,), (), ()
_NORMS = llama.norms({"attention_layernorm": "attn_norm", "feedforward_layernorm": "ffn_norm"})

# llama.cpp's apertus: Llama's tensor names without ffn_gate, q/k norms (Dh,) before RoPE on
# half-split rows (as stored, like Qwen3), an output head of its own; the four xIELU numbers of
# each layer are metadata arrays (one float a layer; alpha_p and alpha_n before their softplus)
GGUF = GgufEntry(
    "apertus", "apertus", "Apertus",
    {**{name: keys for name, keys in llama.GGUF_TENSORS.items() if not name.startswith("blk.{i}.ffn_gate")},
     **llama.GGUF_QK_NORMS},
    {**llama.GGUF_BLOCK, **llama.NO_BIASES, "activation": ("xielu", "has a plain xIELU MLP"),
     "qk_norm": llama.HEAD_QK_NORM, "sliding_window": llama.NO_WINDOW,
     "tie_embeddings": (False, "has an output head of its own in llama.cpp")},
    biases=(), rope_freqs=True, writes=frozenset({"qk_norm"}),
    layer_values={f"xielu.{name}": f"layers.{{i}}.ffn.act.{name}"
                  for name in ("alpha_p", "alpha_n", "beta", "eps")})

APERTUS = FamilySpec(
    model_type="apertus", name="Apertus", hf_class="ApertusForCausalLM",
    fixed={"norm": llama.RMSNORM, "activation": ("xielu", "has a plain xIELU MLP"),
           "scale_embeddings": llama.NO_SCALE, **llama.NO_BIASES, "sliding_window": llama.NO_WINDOW,
           "qk_norm": llama.HEAD_QK_NORM},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config,
    tensors=llama.llama_like(llama.linears(llama.ATTENTION), _MLP, _XIELU, llama.QK_NORMS, _NORMS),
    may_set=frozenset({"qk_norm"}), variants=("LearnedXIELU",),
    claims=((25, lambda c: c.activation == "xielu"),), gguf=GGUF,
    differences=Differences(attention="q/k norms per head", ffn="not gated: xIELU with learned alphas"))

__all__ = ["APERTUS", "LearnedXIELU", "put_learned_xielu"]
