"""handformer: a Transformer written by hand, from attention to trained models."""

from handformer.config import BlockConfig, CausalLMConfig, Seq2SeqConfig, load_config
from handformer.models.causal_lm import CausalLM, CausalLMOutput
from handformer.models.seq2seq import Seq2SeqOutput, Seq2SeqTransformer
from handformer.nn.attention import MultiHeadAttention, scaled_dot_product_attention
from handformer.nn.blocks import DecoderLayer, DecoderOnlyBlock, EncoderLayer
from handformer.nn.feed_forward import FeedForward
from handformer.nn.kv_cache import KVCache
from handformer.nn.masks import causal_mask, padding_mask
from handformer.nn.norms import LayerNorm, RMSNorm

__version__ = "0.1.0"

__all__ = [
    "BlockConfig", "CausalLM", "CausalLMConfig", "CausalLMOutput", "DecoderLayer",
    "DecoderOnlyBlock", "EncoderLayer", "FeedForward", "KVCache", "LayerNorm", "MultiHeadAttention",
    "RMSNorm", "Seq2SeqConfig", "Seq2SeqOutput", "Seq2SeqTransformer", "causal_mask", "load_config",
    "padding_mask", "scaled_dot_product_attention",
]
