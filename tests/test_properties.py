"""Properties that must hold for every input, checked with hypothesis on tiny models.

Padding invariance, causality, batch invariance (right and left padding), multi-head = heads one by
one, norm statistics and torch.nn references, RoPE against the Hugging Face formula, and cached
decoding = full forward. Models get large random weights (`scramble_`) so that every input really
moves the outputs; several tests also assert that a change that *should* matter does.

Shape legend: B batch, T target/query length, S source/key length, D d_model, H heads, V vocab.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.testing import assert_close

from handformer.config import CausalLMConfig, Seq2SeqConfig
from handformer.models.causal_lm import CausalLM
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.nn.attention import MultiHeadAttention
from handformer.nn.masks import causal_mask, key_mask
from handformer.nn.norms import LayerNorm, RMSNorm
from handformer.nn.positions import RotaryEmbedding, apply_rotary

TOL = dict(atol=1e-5, rtol=1e-5)
FAST = settings(max_examples=20, deadline=None, derandomize=True)
SRC_V, TGT_V, LM_V, D, MAX_POS = 13, 17, 23, 16, 32
seeds = st.integers(0, 2**16)


pytestmark = pytest.mark.usefixtures("one_thread")


def scramble_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights of unit-ish gain everywhere (the default inits are small enough to hide leaks)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif p.dim() == 1:
                p.copy_(0.2 * noise)
            elif "embed" in name or "positions" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise / math.sqrt(p.size(1)))
    return model


@functools.cache
def seq2seq(norm_placement: str = "post") -> Seq2SeqTransformer:
    cfg = Seq2SeqConfig(src_vocab_size=SRC_V, tgt_vocab_size=TGT_V, d_model=D, n_heads=4, d_ff=32,
                        n_encoder_layers=2, n_decoder_layers=2, max_positions=MAX_POS, dropout=0.0,
                        norm_placement=norm_placement, pad_id=0)
    return scramble_(Seq2SeqTransformer(cfg), seed=1).eval()


@functools.cache
def causal_lm(preset: str) -> CausalLM:
    small = dict(vocab_size=LM_V, d_model=D, n_heads=4, d_ff=32, n_layers=2, max_positions=MAX_POS,
                 dropout=0.0)
    if preset == "gpt2":
        cfg = CausalLMConfig.gpt2_style(**small)
    else:
        cfg = CausalLMConfig.llama_style(n_kv_heads=2, **small)
    return scramble_(CausalLM(cfg), seed=2).eval()


def ids(g: torch.Generator, shape, vocab: int, low: int = 1) -> Tensor:
    return torch.randint(low, vocab, shape, generator=g)


def random_keep(g: torch.Generator, B: int, L: int) -> Tensor:
    """(B, L) bool, True = real; padding anywhere, at least one real token per row."""
    keep = torch.rand(B, L, generator=g) < 0.6
    keep[torch.arange(B), torch.randint(0, L, (B,), generator=g)] = True
    return keep


presets = st.sampled_from(["gpt2", "llama"])
placements = st.sampled_from(["post", "pre"])


# --- padding invariance ---------------------------------------------------------------------------

@FAST
@given(seed=seeds, placement=placements, S=st.integers(1, 8))
@torch.no_grad()
def test_encoder_ignores_padded_positions(seed, placement, S):
    model, g = seq2seq(placement), torch.Generator().manual_seed(seed)
    x = torch.randn(2, S, D, generator=g)  # (B, S, D) embedded source
    keep = random_keep(g, 2, S)
    x2 = torch.where(keep[..., None], x, torch.randn(2, S, D, generator=g) * 3)
    out, _ = model.encoder(x, key_mask(keep))
    out2, _ = model.encoder(x2, key_mask(keep))
    assert_close(out[keep], out2[keep], **TOL)


@FAST
@given(seed=seeds, placement=placements, T=st.integers(1, 8), S=st.integers(1, 6))
@torch.no_grad()
def test_decoder_self_attention_ignores_padded_target_positions(seed, placement, T, S):
    model, g = seq2seq(placement), torch.Generator().manual_seed(seed)
    y = torch.randn(2, T, D, generator=g)  # (B, T, D) embedded target
    memory = torch.randn(2, S, D, generator=g)  # (B, S, D)
    keep = random_keep(g, 2, T)
    y2 = torch.where(keep[..., None], y, torch.randn(2, T, D, generator=g) * 3)
    self_mask = causal_mask(T) & key_mask(keep)  # (B, 1, T, T)
    out, _, _ = model.decoder(y, memory, self_mask=self_mask)
    out2, _, _ = model.decoder(y2, memory, self_mask=self_mask)
    assert_close(out[keep], out2[keep], **TOL)


@FAST
@given(seed=seeds, placement=placements, T=st.integers(1, 6), S=st.integers(1, 8))
@torch.no_grad()
def test_cross_attention_ignores_padded_memory_positions(seed, placement, T, S):
    model, g = seq2seq(placement), torch.Generator().manual_seed(seed)
    y = torch.randn(2, T, D, generator=g)
    memory = torch.randn(2, S, D, generator=g)
    keep = random_keep(g, 2, S)
    memory2 = torch.where(keep[..., None], memory, torch.randn(2, S, D, generator=g) * 3)
    out, _, _ = model.decoder(y, memory, self_mask=causal_mask(T), memory_mask=key_mask(keep))
    out2, _, _ = model.decoder(y, memory2, self_mask=causal_mask(T), memory_mask=key_mask(keep))
    assert_close(out, out2, **TOL)  # every target position


@FAST
@given(seed=seeds, preset=presets, T=st.integers(1, 10))
@torch.no_grad()
def test_causal_lm_ignores_tokens_where_attention_mask_is_zero(seed, preset, T):
    model, g = causal_lm(preset), torch.Generator().manual_seed(seed)
    x = ids(g, (2, T), LM_V, low=0)
    keep = random_keep(g, 2, T)
    x2 = torch.where(keep, x, ids(g, (2, T), LM_V, low=0))
    out = model(x, attention_mask=keep.long()).logits
    out2 = model(x2, attention_mask=keep.long()).logits
    assert torch.isfinite(out).all()
    assert_close(out[keep], out2[keep], **TOL)


# --- causality ------------------------------------------------------------------------------------

def _change_one(g: torch.Generator, x: Tensor, j: int, vocab: int, low: int = 1) -> Tensor:
    x2 = x.clone()
    x2[:, j] = (x[:, j] - low + torch.randint(1, vocab - low, (x.size(0),), generator=g)) % (vocab - low) + low
    assert torch.all(x2[:, j] != x[:, j])
    return x2


@FAST
@given(seed=seeds, placement=placements, T=st.integers(2, 9), data=st.data())
@torch.no_grad()
def test_seq2seq_decoder_does_not_see_future_targets(seed, placement, T, data):
    model, g = seq2seq(placement), torch.Generator().manual_seed(seed)
    j = data.draw(st.integers(1, T - 1))
    src, tgt = ids(g, (2, 5), SRC_V), ids(g, (2, T), TGT_V)
    tgt2 = _change_one(g, tgt, j, TGT_V)
    out, out2 = model(src, tgt).logits, model(src, tgt2).logits
    assert_close(out[:, :j], out2[:, :j], **TOL)
    assert (out[:, j] - out2[:, j]).abs().max() > 1e-3  # the change is visible where it may be


@FAST
@given(seed=seeds, preset=presets, T=st.integers(2, 10), data=st.data())
@torch.no_grad()
def test_causal_lm_does_not_see_future_tokens(seed, preset, T, data):
    model, g = causal_lm(preset), torch.Generator().manual_seed(seed)
    j = data.draw(st.integers(1, T - 1))
    x = ids(g, (2, T), LM_V, low=0)
    x2 = _change_one(g, x, j, LM_V, low=0)
    out, out2 = model(x).logits, model(x2).logits
    assert_close(out[:, :j], out2[:, :j], **TOL)
    assert (out[:, j] - out2[:, j]).abs().max() > 1e-3
    # The same holds through the explicit-mask path (attention_mask all ones).
    ones = torch.ones(2, T, dtype=torch.long)
    assert_close(model(x2, attention_mask=ones).logits[:, :j], out[:, :j], **TOL)


# --- a sequence alone == the same sequence inside a padded batch ---------------------------------

@FAST
@given(seed=seeds, placement=placements, Ls=st.integers(1, 7), Lt=st.integers(1, 7),
       B=st.integers(2, 3), data=st.data())
@torch.no_grad()
def test_seq2seq_alone_equals_in_padded_batch(seed, placement, Ls, Lt, B, data):
    model, g = seq2seq(placement), torch.Generator().manual_seed(seed)
    row = data.draw(st.integers(0, B - 1))
    src_lens = [Ls if b == row else data.draw(st.integers(1, 9)) for b in range(B)]
    tgt_lens = [Lt if b == row else data.draw(st.integers(1, 9)) for b in range(B)]
    src = torch.zeros(B, max(src_lens), dtype=torch.long)  # pad_id 0, right padding
    tgt = torch.zeros(B, max(tgt_lens), dtype=torch.long)
    for b in range(B):
        src[b, :src_lens[b]] = ids(g, (src_lens[b],), SRC_V)
        tgt[b, :tgt_lens[b]] = ids(g, (tgt_lens[b],), TGT_V)
    alone = model(src[row:row + 1, :Ls], tgt[row:row + 1, :Lt]).logits
    batched = model(src, tgt).logits
    assert_close(batched[row, :Lt], alone[0], **TOL)


@FAST
@given(seed=seeds, preset=presets, L=st.integers(1, 8), B=st.integers(2, 3),
       left=st.booleans(), data=st.data())
@torch.no_grad()
def test_causal_lm_alone_equals_in_padded_batch(seed, preset, L, B, left, data):
    """Right padding, and left padding (positions counted from the attention mask)."""
    model, g = causal_lm(preset), torch.Generator().manual_seed(seed)
    row = data.draw(st.integers(0, B - 1))
    lens = [L if b == row else data.draw(st.integers(1, 10)) for b in range(B)]
    W = max(lens)
    x = ids(g, (B, W), LM_V, low=0)  # pad slots hold arbitrary ids: the mask alone must hide them
    mask = torch.zeros(B, W, dtype=torch.long)
    for b, n in enumerate(lens):
        if left:
            mask[b, W - n:] = 1
        else:
            mask[b, :n] = 1
    real = slice(W - L, W) if left else slice(0, L)
    alone = model(x[row:row + 1, real]).logits
    batched = model(x, attention_mask=mask).logits
    assert torch.isfinite(batched).all()
    assert_close(batched[row, real], alone[0], **TOL)


# --- multi-head attention = heads computed one by one --------------------------------------------

@FAST
@given(seed=seeds, heads=st.sampled_from([(1, 1), (2, 2), (4, 4), (4, 2), (4, 1), (8, 8)]),
       T=st.integers(1, 6), S=st.integers(1, 6), masked=st.booleans(), cross=st.booleans())
@torch.no_grad()
def test_multi_head_equals_heads_one_by_one(seed, heads, T, S, masked, cross):
    H, Hkv = heads
    mha = MultiHeadAttention(D, H, Hkv, bias=True)
    scramble_(mha, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, D, generator=g)
    ctx = torch.randn(2, S, D, generator=g) if cross else x
    L = ctx.size(1)
    mask = random_keep(g, 2 * T, L).view(2, 1, T, L) if masked else None  # (B, 1, T, L)
    out, w = mha(x, ctx if cross else None, mask=mask, need_weights=True)

    Dh = D // H
    heads_out = []
    for h in range(H):
        kv = h // (H // Hkv)  # the key/value head this query head shares
        qs, ks = slice(h * Dh, (h + 1) * Dh), slice(kv * Dh, (kv + 1) * Dh)
        q = x @ mha.q_proj.weight[qs].T + mha.q_proj.bias[qs]  # (B, T, Dh)
        k = ctx @ mha.k_proj.weight[ks].T + mha.k_proj.bias[ks]  # (B, L, Dh)
        v = ctx @ mha.v_proj.weight[ks].T + mha.v_proj.bias[ks]  # (B, L, Dh)
        scores = q @ k.transpose(1, 2) / math.sqrt(Dh)  # (B, T, L)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, 0], float("-inf"))
        a = scores.softmax(-1)
        assert_close(w[:, h], a, **TOL)
        heads_out.append(a @ v)  # (B, T, Dh)
    ref = mha.o_proj(torch.cat(heads_out, dim=-1))  # concat, then W_O
    assert_close(out, ref, **TOL)


# --- norms ----------------------------------------------------------------------------------------

norm_shapes = st.tuples(st.integers(1, 3), st.integers(1, 5), st.sampled_from([2, 8, 16, 64]))


@FAST
@given(seed=seeds, shape=norm_shapes, scale=st.floats(0.01, 100.0), shift=st.floats(-5.0, 5.0))
def test_layernorm_output_has_mean_0_and_variance_1(seed, shape, scale, shift):
    g = torch.Generator().manual_seed(seed)
    # The shift is relative to the spread: an offset of 100x the spread would lose digits to fp32
    # rounding of the input itself, which no normalization can recover.
    x = torch.randn(shape, generator=g)
    x[..., 0], x[..., -1] = 3.0, -3.0  # rows are never (nearly) constant
    x = (x + shift) * scale
    x[..., 0] += scale  # never a constant row
    eps = 1e-5
    y = LayerNorm(shape[-1], eps=eps)(x).double()
    var_x = x.double().var(-1, unbiased=False)
    assert_close(y.mean(-1), torch.zeros_like(var_x), atol=1e-5, rtol=0)
    # var_x / (var_x + eps): 1 up to the epsilon inside the square root.
    assert_close(y.var(-1, unbiased=False), var_x / (var_x + eps), atol=1e-5, rtol=1e-5)


@FAST
@given(seed=seeds, shape=norm_shapes, scale=st.floats(0.01, 100.0))
def test_rmsnorm_output_has_rms_1(seed, shape, scale):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale + 0.5 * scale
    eps = 1e-6
    y = RMSNorm(shape[-1], eps=eps)(x).double()
    ms = x.double().pow(2).mean(-1)
    assert_close(y.pow(2).mean(-1).sqrt(), (ms / (ms + eps)).sqrt(), atol=1e-5, rtol=1e-5)


@FAST
@given(seed=seeds, shape=norm_shapes, eps=st.sampled_from([1e-5, 1e-6, 1e-3]), bf16=st.booleans())
def test_norms_match_torch_nn(seed, shape, eps, bf16):
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    x = torch.randn(shape, generator=g) * 3 + 1
    w, b = torch.randn(d, generator=g), torch.randn(d, generator=g)
    ln, ref_ln = LayerNorm(d, eps), nn.LayerNorm(d, eps=eps)
    rms, ref_rms = RMSNorm(d, eps), nn.RMSNorm(d, eps=eps)
    with torch.no_grad():
        for m in (ln, ref_ln, rms, ref_rms):
            m.weight.copy_(w)
        ln.bias.copy_(b)
        ref_ln.bias.copy_(b)
    if not bf16:
        assert_close(ln(x), ref_ln(x), **TOL)
        assert_close(rms(x), ref_rms(x), **TOL)
        return
    # bf16 input: statistics are taken in fp32, so the result is the fp32 reference rounded once.
    xb = x.bfloat16()
    out = ln(xb)
    assert out.dtype == torch.bfloat16
    assert_close(out, ref_ln(xb.float()).bfloat16(), atol=0, rtol=0)
    # RMSNorm (as Hugging Face Llama): normalize in fp32, cast back to bf16, then scale by the weight.
    unit = ref_rms.__class__(d, eps=eps, elementwise_affine=False)(xb.float())
    assert_close(rms(xb).float(), w * unit.bfloat16().float(), **TOL)


def test_norms_have_the_documented_parameters():
    assert LayerNorm(8).bias is not None and LayerNorm(8, bias=False).bias is None
    assert [n for n, _ in RMSNorm(8).named_parameters()] == ["weight"]


# --- rotary position embedding --------------------------------------------------------------------

def hf_rotary(x: Tensor, position_ids: Tensor, theta: float) -> Tensor:
    """Hugging Face Llama's RoPE, transcribed from modeling_llama (LlamaRotaryEmbedding default rope
    type + rotate_half + apply_rotary_pos_emb)."""
    dim = x.size(-1)
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    inv_freq_expanded = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    freqs = (inv_freq_expanded @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)

    def rotate_half(t):
        t1, t2 = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
        return torch.cat((-t2, t1), dim=-1)

    return (x * cos) + (rotate_half(x) * sin)


def complex_rotary(x: Tensor, position_ids: Tensor, theta: float) -> Tensor:
    """The half-split rotation as complex multiplication: the pair (j, j + Dh/2) is the number
    x_j + i x_{j+Dh/2}, turned by the angle pos * theta^(-2j/Dh). Computed in float64."""
    half = x.size(-1) // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())  # (B, H, T, Dh/2)
    freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.size(-1))  # (Dh/2,)
    angle = position_ids.double()[:, None, :, None] * freq  # (B, 1, T, Dh/2)
    z = z * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag], dim=-1).float()


@FAST
@given(seed=seeds, head_dim=st.sampled_from([2, 4, 8, 16, 64]), T=st.integers(1, 8),
       theta=st.sampled_from([10000.0, 500000.0, 100.0]), offset=st.integers(0, 100))
def test_rotary_matches_hf_half_split_formula(seed, head_dim, T, theta, offset):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, T, head_dim, generator=g)  # (B, H, T, Dh)
    position_ids = torch.randint(0, 128, (2, T), generator=g)
    position_ids[1] = torch.arange(offset, offset + T)
    rope = RotaryEmbedding(head_dim, max_positions=256, theta=theta)
    ours = apply_rotary(x, *rope(position_ids))
    assert_close(ours, hf_rotary(x, position_ids, theta), **TOL)
    assert_close(ours, complex_rotary(x, position_ids, theta), atol=2e-5, rtol=1e-5)
    # A rotation: norms of every (j, j + Dh/2) pair are kept.
    half = head_dim // 2
    pair_norm = x[..., :half] ** 2 + x[..., half:] ** 2
    assert_close(ours[..., :half] ** 2 + ours[..., half:] ** 2, pair_norm, **TOL)


@FAST
@given(seed=seeds, m=st.integers(0, 60), n=st.integers(0, 60), shift=st.integers(0, 60))
def test_rotary_scores_depend_on_relative_position_only(seed, m, n, shift):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    rope = RotaryEmbedding(16, max_positions=128)

    def score(pq, pk):
        rq = apply_rotary(q, *rope(torch.tensor([[pq]])))
        rk = apply_rotary(k, *rope(torch.tensor([[pk]])))
        return (rq * rk).sum()

    assert_close(score(m + shift, n + shift), score(m, n), atol=5e-5, rtol=1e-5)


# --- cached decoding == full forward --------------------------------------------------------------

chunkings = st.lists(st.integers(1, 4), min_size=1, max_size=6)


@FAST
@given(seed=seeds, preset=presets, chunks=chunkings, B=st.integers(1, 2))
@torch.no_grad()
def test_causal_lm_cached_decoding_equals_full_forward(seed, preset, chunks, B):
    """Chunks of 1 are token-by-token decoding; a first chunk > 1 is prefill (chunked if more follow)."""
    model, g = causal_lm(preset), torch.Generator().manual_seed(seed)
    T = sum(chunks)
    x = ids(g, (B, T), LM_V, low=0)
    full = model(x).logits
    cache, start, pieces = model.new_cache(), 0, []
    for n in chunks:
        pieces.append(model(x[:, start:start + n], cache=cache).logits)
        start += n
        assert cache.length == start
    assert_close(torch.cat(pieces, dim=1), full, **TOL)


@FAST
@given(seed=seeds, preset=presets, chunks=chunkings, pads=st.lists(st.integers(0, 3), min_size=2,
                                                                   max_size=2))
@torch.no_grad()
def test_causal_lm_cached_decoding_with_left_padding(seed, preset, chunks, pads):
    model, g = causal_lm(preset), torch.Generator().manual_seed(seed)
    T = sum(chunks) + max(pads)
    x = ids(g, (2, T), LM_V, low=0)
    mask = torch.ones(2, T, dtype=torch.long)
    for b, p in enumerate(pads):
        mask[b, :p] = 0
    first = T - sum(chunks)  # prefill at least the padding, then the chunks
    full = model(x, attention_mask=mask).logits
    cache = model.new_cache(T)
    pieces = [model(x[:, :first], attention_mask=mask[:, :first], cache=cache).logits] if first else []
    start = first
    for n in chunks:
        pieces.append(model(x[:, start:start + n], attention_mask=mask[:, :start + n], cache=cache).logits)
        start += n
    out = torch.cat(pieces, dim=1)
    real = mask.bool()
    assert_close(out[real], full[real], **TOL)


@FAST
@given(seed=seeds, placement=placements, chunks=chunkings, src_lens=st.lists(st.integers(1, 7),
                                                                              min_size=2, max_size=2))
@torch.no_grad()
def test_seq2seq_cached_decoding_equals_full_forward(seed, placement, chunks, src_lens):
    model, g = seq2seq(placement), torch.Generator().manual_seed(seed)
    src = torch.zeros(2, max(src_lens), dtype=torch.long)
    for b, n in enumerate(src_lens):
        src[b, :n] = ids(g, (n,), SRC_V)
    T = sum(chunks)
    tgt = ids(g, (2, T), TGT_V)
    full = model(src, tgt).logits
    memory, src_mask, _ = model.encode(src)
    cache, start, pieces = model.new_cache(T), 0, []
    for n in chunks:
        h, _, _ = model.decode(tgt[:, start:start + n], memory, src_mask, cache=cache)
        pieces.append(model.generator(h))
        start += n
    assert cache.length == T
    assert_close(torch.cat(pieces, dim=1), full, **TOL)
