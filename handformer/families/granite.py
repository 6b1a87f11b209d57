"""Granite (IBM Granite 3.x dense): Llama's block with four constants of muP, each a variant here:

- the token embeddings times `embedding_multiplier` (`ScaledEmbedding`);
- attention scores times `attention_multiplier` in place of 1/sqrt(head_dim) (`GraniteAttention`);
- each sublayer's output times `residual_multiplier` before the add (`GraniteBlock`);
- the logits divided by `logits_scaling` (`ScaledHead`).

They live in the config's family section; every module keeps the lesson's parameter names.

Shape legend: B batch, T query length, D d_model, V vocab.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

import handformer.families.llama as llama
from handformer.config import CausalLMConfig, FamilyConfig
from handformer.families.gemma import GemmaAttention
from handformer.families.hf_config import rope_decoder
from handformer.families.spec import Differences, FamilySpec, GgufEntry
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.blocks import DecoderOnlyBlock
from handformer.nn.embedding import TokenEmbedding
from handformer.nn.kv_cache import LayerKVCache
from handformer.nn.masks import AttentionMask, as_attention_mask

MULTIPLIERS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")


class ScaledEmbedding(nn.Module):
    """The token embedding times a constant (Granite's embedding_multiplier); keeps `weight`."""

    def __init__(self, embed: TokenEmbedding, multiplier: float) -> None:
        super().__init__()
        self.weight = embed.weight  # (V, D), tied to the head where the model ties them
        self.register_buffer("scale", embed.scale * multiplier, persistent=False)

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight) * self.scale  # (B, T) -> (B, T, D)


class GraniteAttention(GemmaAttention):
    """Scores q.k times `multiplier` (Granite's attention_multiplier) instead of 1/sqrt(head_dim)."""

    def __init__(self, attn: MultiHeadAttention, multiplier: float) -> None:
        super().__init__(attn, 1.0, None)
        self.scale = multiplier


class GraniteBlock(DecoderOnlyBlock):
    """The lesson's pre-norm block with each sublayer's output scaled before the add:
    x = x + m * attention(norm(x)), x = x + m * FFN(norm(x))."""

    def __init__(self, block: DecoderOnlyBlock, multiplier: float) -> None:
        nn.Module.__init__(self)  # the lesson block's modules, as they are
        self.pre_norm, self.sliding, self.multiplier = True, block.sliding, multiplier
        self.self_attn, self.attn_norm = block.self_attn, block.attn_norm
        self.ffn, self.ffn_norm, self.dropout = block.ffn, block.ffn_norm, block.dropout
        self.train(block.training)

    def forward(self, x: Tensor, mask: AttentionMask | Tensor | None = None, *,
                rope: tuple[Tensor, Tensor] | None = None, cache: LayerKVCache | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D) -> ((B, T, D), weights (B, H, T, S) or None)."""
        mask = as_attention_mask(mask).of_layer(self.sliding)
        h, weights = self.self_attn(self.attn_norm(x), mask=mask, rope=rope, cache=cache,
                                    need_weights=need_weights)
        x = x + self.dropout(h) * self.multiplier
        x = x + self.dropout(self.ffn(self.ffn_norm(x))) * self.multiplier
        return x, weights


class ScaledHead(nn.Module):
    """The output head with its logits divided by `scale` (Granite's logits_scaling); keeps `weight`."""

    def __init__(self, head: nn.Linear, scale: float) -> None:
        super().__init__()
        self.weight = head.weight  # (V, D)
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight) / self.scale  # (B, T, V)


# --- the family spec -------------------------------------------------------------------------------

def from_hf_config(c: dict[str, Any]) -> CausalLMConfig:
    base = llama.from_hf_config(c)  # SiLU, one bias setting: Llama's checks
    family = FamilyConfig(**{name: float(c.get(name, 1.0)) for name in MULTIPLIERS})
    return rope_decoder(c, bias=base.bias, family=family)


def to_hf_config(cfg: CausalLMConfig) -> dict[str, Any]:
    f = cfg.family
    return {**llama.to_hf_config(cfg), "embedding_multiplier": f.embedding_multiplier or 1.0,
            "attention_multiplier": f.attention_multiplier or cfg.head_dim ** -0.5,
            "residual_multiplier": f.residual_multiplier or 1.0, "logits_scaling": f.logits_scaling or 1.0}


GGUF = GgufEntry("granite", "granite", "Granite", llama.GGUF_TENSORS,
                 {**llama.GGUF_BLOCK, "sliding_window": llama.NO_WINDOW}, rope="pairs", multipliers=True,
                 writes=frozenset(MULTIPLIERS))

GRANITE = FamilySpec(
    model_type="granite", name="Granite", hf_class="GraniteForCausalLM",
    fixed={**llama.LLAMA_BLOCK, "sliding_window": llama.NO_WINDOW},
    from_hf_config=from_hf_config, to_hf_config=to_hf_config, tensors=llama.TENSORS, problems=llama.problems,
    gguf=GGUF,
    may_set=frozenset(MULTIPLIERS), hf_keys=frozenset(MULTIPLIERS),
    claims=((30, lambda c: any(getattr(c.family, name) is not None for name in MULTIPLIERS)),),
    variants=("ScaledEmbedding", "GraniteAttention", "GraniteBlock", "ScaledHead"),
    differences=Differences(attention="scores times attention_multiplier",
                            ffn="each sublayer's output times residual_multiplier",
                            embedding="embeddings times embedding_multiplier, logits / logits_scaling"))

__all__ = ["GRANITE", "GraniteAttention", "GraniteBlock", "ScaledEmbedding", "ScaledHead"]
