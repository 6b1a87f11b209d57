"""The parallel decoder-only block (GPT-J, GPT-NeoX, Falcon, Phi-1/2) as handformer's block computes
it from the same parts: attention and FFN both read the block's input, each through its norm, and
both add to the residual, x + attn(norm_1(x)) + ffn(norm_2(x)); a block of one norm (GPT-J's, Phi's,
Falcon's) has norm_2 = norm_1. Handformer's models run their blocks in sequence; check compares a
learner's parallel block with this one.

Shape legend: B batch, T length, D d_model, H heads, S keys.
"""

from __future__ import annotations

from torch import Tensor, nn

from handformer.nn.blocks import DecoderOnlyBlock
from handformer.nn.kv_cache import LayerKVCache
from handformer.nn.masks import as_attention_mask


class ParallelBlock(DecoderOnlyBlock):
    """handformer's DecoderOnlyBlock, its two sublayers run side by side (see the module docstring)."""

    def forward(self, x: Tensor, mask: object = None, *, rope: tuple[Tensor, Tensor] | None = None,
                cache: LayerKVCache | None = None, need_weights: bool = False,
                ) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, D) -> ((B, T, D), weights (B, H, T, S) or None)."""
        mask = as_attention_mask(mask).of_layer(self.sliding)
        h, weights = self.self_attn(self.attn_norm(x), mask=mask, rope=rope, cache=cache,
                                    need_weights=need_weights)
        return x + self.dropout(h) + self.dropout(self.ffn(self.ffn_norm(x))), weights


def as_parallel_(blocks: list[nn.Module], shared: list[bool]) -> None:
    """handformer's pre-norm blocks, built and filled, computed in parallel from now on (their parts
    and their names unchanged); a block `shared` marks (one norm in the learner's) reads its first
    norm before both sublayers."""
    for block, one in zip(blocks, shared):
        block.__class__ = ParallelBlock
        block.ffn_norm = [block.ffn_norm, block.attn_norm][one]
