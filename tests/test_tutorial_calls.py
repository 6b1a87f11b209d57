"""The calls the tutorials write work on handformer's modules (手写Transformer 03).

    mha = MultiHeadAttention(512, 8); out, attn = mha(x, x, x, mask=None)
    layer(x, enc_output, src_mask, tgt_mask)

MultiHeadAttention.forward(query, key=None, value=None, mask=None, *, need_weights=False): keys
default to the query and values to the keys, so `mha(x)`, `mha(x, memory)` and `mha(q, k, v, mask)`
all work; the tutorials' 0/1 masks mean what `masked_fill(mask == 0, -1e9)` means. Layers are built
from a BlockConfig; the tutorials' EncoderLayer(512, 8, 2048) is a TypeError that shows the line
to write. And the fused kernel agrees with the formula written out (`attention`).
"""

import pytest
import torch
from torch.testing import assert_close

from handformer import BlockConfig, DecoderLayer, EncoderLayer, MultiHeadAttention, causal_mask
from handformer.nn.attention import attention, repeat_kv, scaled_dot_product_attention
from handformer.nn.masks import AttentionMask, as_attention_mask

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture
def mha():
    torch.manual_seed(0)
    return MultiHeadAttention(512, 8).eval()


def test_the_tutorials_test_line(mha):
    x = torch.randn(2, 10, 512)
    out, attn = mha(x, x, x, mask=None)
    assert out.shape == (2, 10, 512) and attn is None  # weights only when asked for
    out2, attn = mha(x, x, x, mask=None, need_weights=True)
    assert attn.shape == (2, 8, 10, 10)
    assert_close(out, out2, **TOL)  # the formula written out (weights asked for) and the fused kernel
    assert_close(attn.sum(-1), torch.ones(2, 8, 10), **TOL)


def test_key_defaults_to_the_query_and_value_to_the_key(mha):
    x, memory = torch.randn(2, 5, 512), torch.randn(2, 7, 512)
    assert torch.equal(mha(x)[0], mha(x, x, x)[0])
    assert torch.equal(mha(x, memory)[0], mha(x, memory, memory)[0])
    keep = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    keep[1, ..., 4:] = False
    assert torch.equal(mha(x, memory, memory, keep)[0], mha(x, memory, mask=keep)[0])


def test_the_tutorials_0_1_masks_are_accepted(mha):
    x = torch.randn(2, 6, 512)
    causal = causal_mask(6)
    as_ints = causal.long()  # 1 = may attend, 0 = hidden
    assert torch.equal(mha(x, mask=as_ints)[0], mha(x, mask=causal)[0])
    assert torch.equal(mha(x, mask=causal.to(torch.uint8))[0], mha(x, mask=causal)[0])


@pytest.mark.parametrize("bad", [torch.full((6, 6), 2), torch.zeros(6, 6), torch.zeros(6, 6).masked_fill(
    ~causal_mask(6), float("-inf"))])
def test_other_masks_get_one_error_naming_both_conventions(mha, bad):
    with pytest.raises(TypeError) as err:
        mha(torch.randn(1, 6, 512), mask=bad)
    message = str(err.value)
    assert "bool" in message and "True = may attend" in message and "1 = may attend" in message


def test_a_mask_where_the_old_call_put_it_is_a_type_error_naming_mask(mha):
    x, memory = torch.randn(1, 4, 512), torch.randn(1, 3, 512)
    for call in (lambda: mha(x, memory, torch.ones(1, 1, 1, 3, dtype=torch.bool)),
                 lambda: mha(x, torch.ones(4, 4, dtype=torch.bool))):
        with pytest.raises(TypeError, match="mask="):
            call()


def test_layers_are_built_from_a_config_and_the_tutorials_sizes_show_the_line():
    with pytest.raises(TypeError, match=r"EncoderLayer\(BlockConfig\(d_model=512, n_heads=8, d_ff=2048\)\)"):
        EncoderLayer(512, 8, 2048)
    with pytest.raises(TypeError, match=r"DecoderLayer\(BlockConfig\(d_model=512, n_heads=8, d_ff=2048, "
                                        r"dropout=0.1\)\)"):
        DecoderLayer(512, 8, 2048, 0.1)
    cfg = BlockConfig(d_model=512, n_heads=8, d_ff=2048)  # the line the error shows
    assert (cfg.norm_placement, cfg.norm, cfg.activation, cfg.dropout) == ("post", "layernorm", "relu", 0.1)


def test_the_tutorials_layer_calls():
    torch.manual_seed(0)
    cfg = BlockConfig(d_model=64, n_heads=4, d_ff=128, dropout=0.0)
    enc, dec = EncoderLayer(cfg).eval(), DecoderLayer(cfg).eval()
    src, tgt = torch.randn(2, 7, 64), torch.randn(2, 5, 64)
    src_mask = torch.ones(2, 1, 1, 7, dtype=torch.long)
    src_mask[1, ..., 5:] = 0  # the tutorials' 0/1 padding mask
    tgt_mask = causal_mask(5).long()[None, None]  # (1, 1, T, T)
    enc_output = enc(src, src_mask)[0]
    out, _, cross = dec(tgt, enc_output, src_mask, tgt_mask, need_weights=True)
    assert out.shape == (2, 5, 64) and cross[1, :, :, 5:].eq(0).all()  # padding gets no weight
    by_name = dec(tgt, enc_output, memory_mask=src_mask.bool(), self_mask=tgt_mask.bool(), need_weights=True)[0]
    assert torch.equal(out, by_name)


def test_a_module_given_a_plain_mask_builds_its_own_mask_object():
    """A model builds one AttentionMask per forward; a lesson module called alone with a tensor
    (or nothing) builds it itself, rows that see no key included: zeros, never NaN."""
    torch.manual_seed(0)
    enc = EncoderLayer(BlockConfig(d_model=32, n_heads=4, d_ff=64, dropout=0.0)).eval()
    x = torch.randn(2, 5, 32)
    keep = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    keep[0, 0, 2] = False  # query 2 of sentence 0 sees no key
    assert torch.equal(enc(x, keep)[0], enc(x, as_attention_mask(keep))[0])
    assert torch.isfinite(enc(x, keep)[0]).all()
    assert torch.equal(enc(x)[0], enc(x, AttentionMask())[0])


@pytest.mark.parametrize("H, Hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("masked", [False, True])
def test_the_fused_path_agrees_with_the_formula(H, Hkv, masked):
    g = torch.Generator().manual_seed(H * 10 + Hkv)
    q = torch.randn(2, H, 5, 8, generator=g)
    k, v = torch.randn(2, Hkv, 7, 8, generator=g), torch.randn(2, Hkv, 7, 8, generator=g)
    mask = (torch.rand(2, 1, 5, 7, generator=g) < 0.6) | torch.eye(5, 7, dtype=torch.bool) if masked else None
    fused, none = scaled_dot_product_attention(q, k, v, mask)
    assert none is None
    explicit, weights = attention(q, repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv), mask)
    assert_close(fused, explicit, **TOL)
    assert_close(scaled_dot_product_attention(q, k, v, mask, need_weights=True)[1], weights, **TOL)
