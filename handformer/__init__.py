"""handformer: a Transformer written by hand, from attention to trained models."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from handformer.config import BlockConfig, CausalLMConfig, Seq2SeqConfig, load_config
from handformer.models.causal_lm import CausalLM, CausalLMOutput
from handformer.models.seq2seq import Seq2SeqOutput, Seq2SeqTransformer
from handformer.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from handformer.nn.blocks import DecoderLayer, DecoderOnlyBlock, EncoderLayer
from handformer.nn.feed_forward import FeedForward, GatedFeedForward
from handformer.nn.kv_cache import KVCache
from handformer.nn.masks import causal_mask, padding_mask
from handformer.nn.norms import LayerNorm, RMSNorm
from handformer.nn.rolling_kv_cache import RollingKVCache

if TYPE_CHECKING:
    from handformer.generation.chat import ChatSession

__version__ = "0.1.0"


def chat(run_dir: str | os.PathLike, **options: Any) -> ChatSession:
    """A chat session with an instruction-tuned run directory: `chat("runs/x").send("Hi!")`.
    Options: system, temperature, top_k, top_p, seed, max_new_tokens, device, notify (see
    `handformer.tasks.lm.chat.chat`; imported on first use, so `import handformer` stays light)."""
    from handformer.tasks.lm.chat import chat as chat_with_run

    return chat_with_run(run_dir, **options)


__all__ = [
    "BlockConfig", "CausalLM", "CausalLMConfig", "CausalLMOutput", "DecoderLayer",
    "DecoderOnlyBlock", "EncoderLayer", "FeedForward", "GatedFeedForward", "KVCache", "LayerNorm",
    "MultiHeadAttention", "RMSNorm", "RollingKVCache",
    "Seq2SeqConfig", "Seq2SeqOutput", "Seq2SeqTransformer", "causal_mask", "load_config",
    "chat", "padding_mask", "scaled_dot_product_attention",
]
