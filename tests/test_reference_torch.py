"""handformer's attention, layers and encoder-decoder stack against torch.nn, with copied weights.

torch.nn's boolean masks mean True = blocked; ours mean True = may attend. The conversion (`~mask`)
happens here, at that boundary only. The torch.nn reference modules run in train mode with dropout 0
so that they take their plain (non-fused, non-nested-tensor) path; both are deterministic.

Shape legend: B batch, T target/query length, S source/key length, D d_model, H heads.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from handformer.config import BlockConfig, Seq2SeqConfig
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.blocks import DecoderLayer, EncoderLayer
from handformer.nn.masks import AttentionMask, causal_mask, key_mask
from handformer.nn.norms import LayerNorm, NoNorm

TOL = dict(atol=1e-5, rtol=1e-5)
D, H, F_, B, T, S = 16, 4, 32, 3, 5, 6


pytestmark = pytest.mark.usefixtures("one_thread")


def randomize_(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random values everywhere (torch.nn initialises biases and norms to 0/1, which hides mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            centre = 1.0 if "norm" in name and name.endswith("weight") else 0.0  # norm scales near 1
            p.copy_(centre + 0.3 * torch.randn(p.shape, generator=g))
    return module


def copy_mha_(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        wq, wk, wv = ref.in_proj_weight.chunk(3, dim=0)
        bq, bk, bv = ref.in_proj_bias.chunk(3, dim=0)
        ours.q_proj.weight.copy_(wq)
        ours.k_proj.weight.copy_(wk)
        ours.v_proj.weight.copy_(wv)
        ours.q_proj.bias.copy_(bq)
        ours.k_proj.bias.copy_(bk)
        ours.v_proj.bias.copy_(bv)
        ours.o_proj.weight.copy_(ref.out_proj.weight)
        ours.o_proj.bias.copy_(ref.out_proj.bias)


def copy_linear_(ours: nn.Linear | LayerNorm, ref: nn.Module) -> None:
    with torch.no_grad():
        ours.weight.copy_(ref.weight)
        ours.bias.copy_(ref.bias)


def copy_encoder_layer_(ours: EncoderLayer, ref: nn.TransformerEncoderLayer) -> None:
    copy_mha_(ours.self_attn, ref.self_attn)
    copy_linear_(ours.ffn.up_proj, ref.linear1)
    copy_linear_(ours.ffn.down_proj, ref.linear2)
    copy_linear_(ours.attn_norm, ref.norm1)
    copy_linear_(ours.ffn_norm, ref.norm2)


def copy_decoder_layer_(ours: DecoderLayer, ref: nn.TransformerDecoderLayer) -> None:
    copy_mha_(ours.self_attn, ref.self_attn)
    copy_mha_(ours.cross_attn, ref.multihead_attn)
    copy_linear_(ours.ffn.up_proj, ref.linear1)
    copy_linear_(ours.ffn.down_proj, ref.linear2)
    copy_linear_(ours.attn_norm, ref.norm1)
    copy_linear_(ours.cross_attn_norm, ref.norm2)
    copy_linear_(ours.ffn_norm, ref.norm3)


def lengths_to_keep(lengths: list[int], total: int) -> torch.Tensor:
    """(B,) lengths -> (B, total) bool, True = real token (right padding)."""
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]


def block_cfg(norm_placement: str) -> BlockConfig:
    return BlockConfig(d_model=D, n_heads=H, d_ff=F_, dropout=0.0, activation="relu",
                       norm_placement=norm_placement)


def inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, D, generator=g), torch.randn(B, S, D, generator=g)


# --- MultiHeadAttention vs nn.MultiheadAttention ------------------------------------------------

def make_mha_pair(seed=0):
    ref = randomize_(nn.MultiheadAttention(D, H, bias=True, batch_first=True, dropout=0.0), seed).train()
    ours = MultiHeadAttention(D, H, bias=True)
    copy_mha_(ours, ref)
    return ours, ref


def test_mha_parameter_count_is_4d2_weights_plus_4d_biases():
    for d, h in [(16, 4), (512, 8), (48, 3)]:
        mha = MultiHeadAttention(d, h, bias=True)
        weights = sum(p.numel() for n, p in mha.named_parameters() if n.endswith("weight"))
        biases = sum(p.numel() for n, p in mha.named_parameters() if n.endswith("bias"))
        assert weights == 4 * d * d
        assert biases == 4 * d
        ref = nn.MultiheadAttention(d, h, bias=True, batch_first=True)
        assert sum(p.numel() for p in mha.parameters()) == sum(p.numel() for p in ref.parameters())
    assert sum(p.numel() for p in MultiHeadAttention(16, 4, bias=False).parameters()) == 4 * 16 * 16


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("kind", ["self", "self_padding", "self_causal", "self_causal_padding",
                                  "cross", "cross_padding"])
def test_mha_matches_torch(kind, need_weights):
    ours, ref = make_mha_pair()
    x, ctx = inputs()
    cross = kind.startswith("cross")
    src = ctx if cross else x
    L = src.size(1)
    keep = lengths_to_keep([L, L - 2, 2], L) if "padding" in kind else None  # (B, L) True = real
    causal = causal_mask(T) if "causal" in kind else None  # (T, T) True = may attend
    our_mask = None
    if keep is not None:
        our_mask = key_mask(keep)
    if causal is not None:
        our_mask = causal if our_mask is None else our_mask & causal

    out, w = ours(x, src if cross else None, mask=our_mask, need_weights=need_weights)
    ref_out, ref_w = ref(x, src, src, key_padding_mask=None if keep is None else ~keep,
                         attn_mask=None if causal is None else ~causal, need_weights=True,
                         average_attn_weights=False)
    assert_close(out, ref_out, **TOL)
    if need_weights:
        assert w.shape == (B, H, T, L)
        assert_close(w, ref_w, **TOL)
        _, ref_avg = ref(x, src, src, key_padding_mask=None if keep is None else ~keep,
                         attn_mask=None if causal is None else ~causal, need_weights=True,
                         average_attn_weights=True)
        assert_close(w.mean(1), ref_avg, **TOL)
    else:
        assert w is None


def test_mha_gradients_match_torch():
    ours, ref = make_mha_pair(seed=3)
    x, ctx = inputs(seed=4)
    keep = lengths_to_keep([S, 3, 1], S)
    out, _ = ours(x, ctx, mask=key_mask(keep))
    ref_out, _ = ref(x, ctx, ctx, key_padding_mask=~keep, need_weights=False)
    out.pow(2).sum().backward()
    ref_out.pow(2).sum().backward()
    wq, wk, wv = ref.in_proj_weight.grad.chunk(3)
    assert_close(ours.q_proj.weight.grad, wq, **TOL)
    assert_close(ours.k_proj.weight.grad, wk, **TOL)
    assert_close(ours.v_proj.weight.grad, wv, **TOL)
    assert_close(ours.o_proj.weight.grad, ref.out_proj.weight.grad, **TOL)


# --- EncoderLayer / DecoderLayer vs nn.TransformerEncoderLayer / nn.TransformerDecoderLayer --------

@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_encoder_layer_matches_torch(norm_placement):
    ref = nn.TransformerEncoderLayer(D, H, F_, dropout=0.0, activation="relu", batch_first=True,
                                     norm_first=norm_placement == "pre")
    randomize_(ref, seed=5).train()
    ours = EncoderLayer(block_cfg(norm_placement)).eval()
    copy_encoder_layer_(ours, ref)
    _, x = inputs(seed=6)
    keep = lengths_to_keep([S, 4, 2], S)
    out, _ = ours(x, key_mask(keep))
    assert_close(out, ref(x, src_key_padding_mask=~keep), **TOL)
    out, _ = ours(x)
    assert_close(out, ref(x), **TOL)


@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_decoder_layer_matches_torch(norm_placement):
    ref = nn.TransformerDecoderLayer(D, H, F_, dropout=0.0, activation="relu", batch_first=True,
                                     norm_first=norm_placement == "pre")
    randomize_(ref, seed=7).train()
    ours = DecoderLayer(block_cfg(norm_placement)).eval()
    copy_decoder_layer_(ours, ref)
    y, memory = inputs(seed=8)
    tgt_keep = lengths_to_keep([T, 3, 2], T)
    src_keep = lengths_to_keep([S, 5, 1], S)
    causal = causal_mask(T)
    out, self_w, cross_w = ours(y, memory, self_mask=causal & key_mask(tgt_keep),
                                memory_mask=key_mask(src_keep))
    assert self_w is None and cross_w is None
    ref_out = ref(y, memory, tgt_mask=~causal, tgt_key_padding_mask=~tgt_keep,
                  memory_key_padding_mask=~src_keep)
    assert_close(out, ref_out, **TOL)
    # is_causal shortcut without padding equals the explicit causal mask.
    out, _, _ = ours(y, memory, self_mask=AttentionMask(is_causal=True))
    assert_close(out, ref(y, memory, tgt_mask=~causal), **TOL)


def test_decoder_masks_come_in_the_tutorials_order():
    """Tutorials call `layer(x, memory, src_mask, tgt_mask)`: the source padding mask, then the
    causal target mask. Both broadcast to the same shapes, so the order is pinned here: the
    positional call equals the call by name, and swapping the two changes the output."""
    layer = DecoderLayer(block_cfg("post")).eval()
    decoder = Seq2SeqTransformer(Seq2SeqConfig(d_model=D, n_heads=H, d_ff=F_, n_encoder_layers=1,
                                               n_decoder_layers=1, src_vocab_size=11,
                                               tgt_vocab_size=11)).decoder.eval()
    y, memory = inputs(seed=8)
    src_mask = key_mask(lengths_to_keep([S, 5, 1], S))  # (B, 1, 1, S)
    tgt_mask = causal_mask(T) & key_mask(lengths_to_keep([T, 3, 2], T))  # (B, 1, T, T)
    for module in (layer, decoder):
        positional = module(y, memory, src_mask, tgt_mask)[0]
        assert torch.equal(positional, module(y, memory, memory_mask=src_mask, self_mask=tgt_mask)[0])
        swapped = module(y, memory, memory_mask=causal_mask(T, S) & src_mask, self_mask=None)[0]
        assert not torch.allclose(positional, swapped)


# --- the whole encoder-decoder stack vs nn.Transformer -------------------------------------------

@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_encoder_decoder_stack_matches_nn_transformer(norm_placement):
    n_layers = 2
    ref = nn.Transformer(D, H, n_layers, n_layers, F_, dropout=0.0, activation="relu",
                         batch_first=True, norm_first=norm_placement == "pre")
    randomize_(ref, seed=9).train()
    cfg = Seq2SeqConfig(d_model=D, n_heads=H, d_ff=F_, dropout=0.0, activation="relu",
                        norm_placement=norm_placement, n_encoder_layers=n_layers,
                        n_decoder_layers=n_layers, src_vocab_size=11, tgt_vocab_size=11)
    model = Seq2SeqTransformer(cfg).eval()
    for ours, theirs in zip(model.encoder.layers, ref.encoder.layers):
        copy_encoder_layer_(ours, theirs)
    for ours, theirs in zip(model.decoder.layers, ref.decoder.layers):
        copy_decoder_layer_(ours, theirs)

    if norm_placement == "pre":
        # Our pre-norm stacks end with a final norm: the counterpart of nn.Transformer's.
        copy_linear_(model.encoder.norm, ref.encoder.norm)
        copy_linear_(model.decoder.norm, ref.decoder.norm)

        def enc_final(h):
            return h

        dec_final = enc_final
    else:
        # The paper's post-norm model has no final norm; nn.Transformer always adds one. Match it
        # here, outside the model, with copied weights.
        assert isinstance(model.encoder.norm, NoNorm) and isinstance(model.decoder.norm, NoNorm)
        enc_final, dec_final = LayerNorm(D), LayerNorm(D)
        copy_linear_(enc_final, ref.encoder.norm)
        copy_linear_(dec_final, ref.decoder.norm)

    y, x = inputs(seed=10)
    src_keep = lengths_to_keep([S, 4, 3], S)
    tgt_keep = lengths_to_keep([T, T, 2], T)
    causal = causal_mask(T)

    memory = enc_final(model.encoder(x, key_mask(src_keep))[0])
    h, _, _ = model.decoder(y, memory, self_mask=causal & key_mask(tgt_keep),
                            memory_mask=key_mask(src_keep))
    out = dec_final(h)
    ref_out = ref(x, y, tgt_mask=~causal, src_key_padding_mask=~src_keep,
                  tgt_key_padding_mask=~tgt_keep, memory_key_padding_mask=~src_keep)
    assert_close(out, ref_out, **TOL)
    assert_close(memory, ref.encoder(x, src_key_padding_mask=~src_keep), **TOL)
