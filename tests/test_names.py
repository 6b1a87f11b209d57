"""docs/names.md and docs/zh/names.md: every handformer name they give is the code's name, and the
reasons they give for boolean masks with -inf hold."""

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch

from handformer import (
    BlockConfig,
    CausalLMConfig,
    CausalLMOutput,
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    RMSNorm,
    Seq2SeqConfig,
    Seq2SeqOutput,
    Seq2SeqTransformer,
    padding_mask,
    scaled_dot_product_attention,
)
from handformer.generation import decoding, generate, sampling
from handformer.nn import masks

DOCS = Path(__file__).resolve().parent.parent / "docs"


def params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_attention_names():
    mha = MultiHeadAttention(64, 4)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "split_heads"):
        assert hasattr(mha, name), name
    assert mha.n_heads == 4 and mha.head_dim == 16 == BlockConfig(d_model=64, n_heads=4).head_dim
    assert params(MultiHeadAttention.__init__) == ["d_model", "n_heads", "n_kv_heads", "bias", "dropout",
                                                   "head_dim", "qkv_bias", "qk_norm", "norm_eps"]
    assert params(mha.forward)[:4] == ["query", "key", "value", "mask"] and "need_weights" in params(mha.forward)
    out, weights = mha(torch.randn(1, 3, 64))
    assert weights is None  # only with need_weights=True


def test_feed_forward_names():
    assert params(FeedForward.__init__) == ["d_model", "d_ff", "activation", "bias"]
    assert [n for n, _ in FeedForward(8, 16).named_children()] == ["up_proj", "down_proj"]
    assert {n for n, _ in FeedForward(8, 16, "swiglu").named_children()} == {"up_proj", "gate_proj", "down_proj"}
    assert not any(isinstance(m, torch.nn.Dropout) for m in FeedForward(8, 16).modules())


def test_layer_names_and_the_decoder_mask_order():
    cfg = BlockConfig(d_model=16, n_heads=2, d_ff=32)
    assert cfg.norm_placement == "post" and Seq2SeqConfig().norm_placement == "post"
    enc, dec = EncoderLayer(cfg), DecoderLayer(cfg)
    assert {"self_attn", "attn_norm", "ffn", "ffn_norm"} <= {n for n, _ in enc.named_children()}
    assert {"self_attn", "cross_attn", "attn_norm", "cross_attn_norm", "ffn", "ffn_norm"} <= {
        n for n, _ in dec.named_children()}
    assert params(enc.forward)[:2] == ["x", "mask"]
    # The tutorial's order, layer(x, enc_output, src_mask, tgt_mask), by position or by name.
    assert params(dec.forward)[:4] == ["x", "memory", "memory_mask", "self_mask"]
    kinds = {n: p.kind for n, p in inspect.signature(dec.forward).parameters.items()}
    assert kinds["self_mask"] == kinds["memory_mask"] == inspect.Parameter.POSITIONAL_OR_KEYWORD
    x, memory = torch.randn(1, 3, 16), torch.randn(1, 4, 16)
    assert len(enc(x)) == 2 and len(dec(x, memory)) == 3
    assert params(LayerNorm.__init__) == ["d_model", "eps", "bias"] and params(RMSNorm.__init__) == ["d_model", "eps"]


def test_model_names():
    model = Seq2SeqTransformer(Seq2SeqConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=16, n_heads=2,
                                             d_ff=32, n_encoder_layers=1, n_decoder_layers=1))
    assert {"src_embed", "tgt_embed", "positions", "encoder", "decoder", "generator"} <= {
        n for n, _ in model.named_children()}
    assert params(model.forward)[:3] == ["src_ids", "tgt_ids", "need_weights"]
    assert [f.name for f in dataclasses.fields(Seq2SeqOutput)] == [
        "logits", "encoder_attentions", "decoder_attentions", "cross_attentions"]
    assert [f.name for f in dataclasses.fields(CausalLMOutput)] == ["logits", "attentions"]
    for cls, fields in ((Seq2SeqConfig, ("n_encoder_layers", "n_decoder_layers", "pad_id", "max_positions")),
                        (CausalLMConfig, ("n_layers", "max_positions"))):
        assert set(fields) <= {f.name for f in dataclasses.fields(cls)}
    for module, name in ((decoding, "greedy_decode"), (decoding, "beam_search"), (generate, "generate"),
                         (sampling, "top_k_filter"), (sampling, "top_p_filter"), (masks, "document_mask")):
        assert callable(getattr(module, name)), name


def test_the_sampling_names():
    """docs/names.md's rows from logits to tokens name these functions with these parameters."""
    assert params(sampling.apply_temperature) == ["logits", "temperature"]
    assert params(sampling.top_k_filter) == ["logits", "k"] and params(sampling.top_p_filter) == ["logits", "p"]
    assert params(sampling.filter_logits) == ["logits", "temperature", "top_k", "top_p"]
    assert params(sampling.next_tokens) == ["logits", "temperature", "top_k", "top_p", "generator"]
    assert params(generate.generate)[:3] == ["model", "prompts", "max_new_tokens"]
    assert {"temperature", "top_k", "top_p", "seed"} <= set(params(generate.generate))


def test_minus_1e9_does_not_fit_in_float16():
    scores = torch.zeros(1, 2, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="overflow"):
        scores.masked_fill(torch.tensor([[True, False]]), -1e9)
    assert scores.masked_fill(torch.tensor([[True, False]]), float("-inf"))[0, 0] == float("-inf")


def test_fully_masked_rows_attend_to_padding_with_1e9_and_to_nothing_in_handformer():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    keep = torch.tensor([[True, True, False], [False, False, False]])  # query 1 sees no key
    tutorial = torch.softmax((q @ k.transpose(-2, -1) / 2).masked_fill(~keep, -1e9), dim=-1)
    assert torch.allclose(tutorial[0, 0, 1], torch.full((3,), 1 / 3))  # uniform over masked keys
    out, weights = scaled_dot_product_attention(q, k, v, keep, need_weights=True)
    assert weights[0, 0, 1].eq(0).all() and out[0, 0, 1].eq(0).all()
    assert torch.allclose(weights[0, 0, 0], tutorial[0, 0, 0]) and weights[0, 0, 0, 2] == 0
    assert padding_mask(torch.tensor([[5, 0]]), 0).dtype == torch.bool


@pytest.mark.parametrize("path", [DOCS / "names.md", DOCS / "zh" / "names.md"])
def test_the_tables_name_the_code(path):
    text = path.read_text(encoding="utf-8")
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "gate_proj", "n_heads",
                 "head_dim", "self_mask", "memory_mask", "need_weights", '"-inf"', "-1e9"):
        assert name in text, f"{path.name} does not mention {name}"
    for tutorial in ("w_q", "w_k", "w_v", "fc", "linear1", "linear2", "num_heads", "src_mask", "tgt_mask"):
        assert re.search(rf"`[^`]*\b{tutorial}\b[^`]*`", text), f"{path.name} does not mention {tutorial}"
    other = "zh/names.md" if path.parent == DOCS else "../names.md"
    assert f"({other})" in text, "the two tables link each other"
