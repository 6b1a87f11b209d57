"""fuse_projections: a fused model computes what the unfused one does (logits within 1e-5, the same
greedy tokens), cached and uncached, with attention weights, next to quantization and LoRA."""

from __future__ import annotations

import pytest
import torch
from helpers import missing
from torch import nn

from handformer.adapters.lora import LoRAConfig, add_lora
from handformer.config import CausalLMConfig, Seq2SeqConfig
from handformer.generation.generate import generate
from handformer.inference.fuse import (
    FusedGatedFeedForward,
    FusedSelfAttention,
    fuse_projections,
    stack_linears,
)
from handformer.inference.packed_linear import PackedLinear, pack_linears, packing_available
from handformer.inference.quant import quantize_linears
from handformer.models.causal_lm import CausalLM
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.feed_forward import FeedForward

CONFIGS = {
    "llama": lambda: CausalLMConfig.llama_style(vocab_size=61, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48,
                                                n_layers=2, max_positions=64),
    "gpt2": lambda: CausalLMConfig.gpt2_style(vocab_size=61, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                              max_positions=64, dropout=0.0),
    "qwen-like": lambda: CausalLMConfig.llama_style(vocab_size=61, d_model=32, n_heads=4, n_kv_heads=1,
                                                    d_ff=48, n_layers=2, max_positions=64, qkv_bias=True),
}


def twins(name: str) -> tuple[CausalLM, CausalLM]:
    torch.manual_seed(0)
    model = CausalLM(CONFIGS[name]()).eval()
    with torch.no_grad():  # biases are zero at init: give them values so fusing them is tested
        for n, p in model.named_parameters():
            if n.endswith("bias"):
                p.normal_(std=0.1)
    fused = CausalLM(model.cfg).eval()
    fused.load_state_dict(model.state_dict())
    return model, fuse_projections(fused)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_logits_and_greedy_tokens_equal_unfused(name):
    model, fused = twins(name)
    assert not any(m.training for m in fused.modules())  # the new modules keep the model's eval mode
    assert any(isinstance(m, FusedSelfAttention) for m in fused.modules())
    assert not any(type(m) is MultiHeadAttention for m in fused.modules())
    gated = model.cfg.activation == "swiglu"
    assert any(isinstance(m, FusedGatedFeedForward) for m in fused.modules()) == gated
    ids = torch.randint(0, 61, (3, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 11, dtype=torch.bool)
    mask[1, :4] = False  # a left-padded row
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}):
            torch.testing.assert_close(fused(ids, **kwargs).logits, model(ids, **kwargs).logits,
                                       rtol=0, atol=1e-5)
    prompts = [[5, 9, 2], [7], [1, 2, 3, 4, 5]]
    for batch in (prompts[:1], prompts):
        assert generate(fused, batch, 12, temperature=0) == generate(model, batch, 12, temperature=0)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_fused_cached_equals_fused_uncached(name):
    _, fused = twins(name)
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = fused(ids).logits  # (B, 9, V)
        cache = fused.new_cache()
        steps = [fused(ids[:, :5], cache=cache).logits] + [fused(ids[:, t:t + 1], cache=cache).logits
                                                          for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-5, atol=1e-5)  # as unfused
    assert (generate(fused, [[3, 4, 5]], 10, temperature=0)
            == generate(fused, [[3, 4, 5]], 10, temperature=0, use_cache=False))


def test_fused_attention_weights_equal_unfused():
    model, fused = twins("llama")
    ids = torch.randint(0, 61, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, theirs = fused(ids, need_weights=True), model(ids, need_weights=True)
    for w_fused, w in zip(ours.attentions, theirs.attentions, strict=True):
        torch.testing.assert_close(w_fused, w, rtol=0, atol=1e-6)


def test_fusing_twice_changes_nothing_and_cross_attention_is_never_fused():
    _, fused = twins("llama")
    state = {k: v.clone() for k, v in fused.state_dict().items()}
    fuse_projections(fused)
    assert fused.state_dict().keys() == state.keys()
    for key, value in fused.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert "layers.0.self_attn.qkv_proj.weight" in state and "layers.0.ffn.gate_up_proj.weight" in state

    torch.manual_seed(0)
    cfg = Seq2SeqConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2, d_ff=32,
                        n_encoder_layers=1, n_decoder_layers=1, dropout=0.0)
    seq2seq = Seq2SeqTransformer(cfg).eval()
    src, tgt = torch.randint(1, 20, (2, 6)), torch.randint(1, 20, (2, 5))
    with torch.no_grad():
        before = seq2seq(src, tgt).logits
        fuse_projections(seq2seq)
        after = seq2seq(src, tgt).logits
    layer = seq2seq.decoder.layers[0]
    assert isinstance(layer.self_attn, FusedSelfAttention) and type(layer.cross_attn) is MultiHeadAttention
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="cross-attention"):
        layer.self_attn(torch.zeros(1, 2, 16), torch.zeros(1, 3, 16))


@pytest.mark.parametrize("bits", [8, 4])
def test_quantizing_before_or_after_fusing_gives_the_same_model(bits):
    """Per-output-channel (int8) and per-row-group (int4) scales do not mix rows, so a stacked
    matrix quantizes to the stacked quantized matrices; a quantized layer is never fused."""
    model, fused = twins("llama")
    quantize_linears(model, bits=bits, group_size=32)
    quantize_linears(fused, bits=bits, group_size=32)
    quantized_first = CausalLM(model.cfg).eval()
    quantized_first.load_state_dict(twins("llama")[0].state_dict())
    quantize_linears(quantized_first, bits=bits, group_size=32)
    fuse_projections(quantized_first)
    assert not any(isinstance(m, (FusedSelfAttention, FusedGatedFeedForward))
                   for m in quantized_first.modules())
    ids = torch.randint(0, 61, (2, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        reference = model(ids).logits
        torch.testing.assert_close(fused(ids).logits, reference, rtol=0, atol=1e-5)
        torch.testing.assert_close(quantized_first(ids).logits, reference, rtol=0, atol=0)
    assert generate(fused, [[1, 2, 3]], 8, temperature=0) == generate(model, [[1, 2, 3]], 8, temperature=0)


def test_lora_layers_are_left_alone():
    model, _ = twins("llama")
    add_lora(model, LoRAConfig(rank=2, targets=["q_proj", "down_proj"]))
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "lora_B"):
                m.lora_B.normal_()  # adapters that change the output
    ids = torch.randint(0, 61, (1, 6))
    with torch.no_grad():
        before = model(ids).logits
        fuse_projections(model)
        after = model(ids).logits
    block = model.layers[0]
    assert type(block.self_attn) is MultiHeadAttention  # its q_proj is a LoRA layer
    assert isinstance(block.ffn, FusedGatedFeedForward)  # gate and up are plain; down is LoRA
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)


def test_stack_linears():
    a, b = nn.Linear(4, 3), nn.Linear(4, 2)
    x = torch.randn(5, 4)
    torch.testing.assert_close(stack_linears(a, b)(x), torch.cat([a(x), b(x)], -1))
    with pytest.raises(ValueError, match="only some have a bias"):
        stack_linears(a, nn.Linear(4, 2, bias=False))
    plain = FeedForward(4, 8, "gelu")
    assert fuse_projections(nn.ModuleDict({"ffn": plain}))["ffn"] is plain  # not gated: unchanged


def test_fused_layers_can_be_packed_afterwards():
    """prepare_for_decoding packs large weights: a fused matrix is one more nn.Linear to pack."""
    if not packing_available():
        missing("this torch has no oneDNN linear packing (torch.ops.mkldnn; an x86 build of torch has it)")
    torch.manual_seed(0)
    model = CausalLM(CausalLMConfig.llama_style(vocab_size=61, d_model=256, n_heads=4, n_kv_heads=2, d_ff=512,
                                                n_layers=1, max_positions=32)).eval()
    fused = CausalLM(model.cfg).eval()
    fused.load_state_dict(model.state_dict())
    packed = pack_linears(fuse_projections(fused))
    assert "layers.0.ffn.gate_up_proj" in packed  # 2 x 512 x 256 fp32 = 1 MiB: packed
    assert isinstance(fused.layers[0].ffn.gate_up_proj, PackedLinear)
    ids = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(fused(ids).logits, model(ids).logits, rtol=0, atol=1e-5)
    assert generate(fused, [[1, 2, 3]], 8, temperature=0) == generate(model, [[1, 2, 3]], 8, temperature=0)


def test_removing_dropout_changes_no_output_and_prepare_does_it():
    """In eval mode dropout returns its input: NoDropout computes the same (called plainly, without
    nn.Module's hooks), and decoding preparation puts one in the place of every nn.Dropout."""
    from handformer.inference.dropout import NoDropout, remove_dropout
    from handformer.inference.prepare import prepare_for_decoding

    torch.manual_seed(0)
    cfg = CausalLMConfig.gpt2_style(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_positions=32,
                                    dropout=0.1)
    model = CausalLM(cfg).eval()
    ids = torch.randint(0, 50, (2, 7))
    before = model(ids).logits
    n_dropouts = sum(isinstance(m, torch.nn.Dropout) for m in model.modules())
    assert n_dropouts == 1 + cfg.n_layers  # the embeddings', and one a block (used after each sublayer)
    remove_dropout(model)
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
    assert sum(isinstance(m, NoDropout) for m in model.modules()) == n_dropouts
    x = torch.randn(3, 4)
    assert NoDropout()(x) is x
    assert torch.equal(model(ids).logits, before)
    prepared = prepare_for_decoding(CausalLM(cfg))
    assert not any(isinstance(m, torch.nn.Dropout) for m in prepared.modules())
