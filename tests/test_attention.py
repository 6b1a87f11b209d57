"""The attention function and the mask helpers.

Pins the two paths of `scaled_dot_product_attention` (fused F.scaled_dot_product_attention vs the
explicit softmax(QK^T/sqrt(d_k))V) against each other and against the formula, and the
fully-masked-row contract: zero output, zero weights, finite gradients, in fp32 and bf16 autocast.

Shape legend: B batch, H query heads, Hkv key/value heads, T query length, S key length, Dh head dim.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from handformer.nn.attention import repeat_kv, scaled_dot_product_attention
from handformer.nn.masks import AttentionMask, causal_mask, document_mask, key_mask, padding_mask

TOL = dict(atol=1e-5, rtol=1e-5)


pytestmark = pytest.mark.usefixtures("one_thread")


def qkv(B=2, H=4, Hkv=4, T=5, S=7, Dh=8, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, Dh, generator=g)  # (B, H, T, Dh)
    k = torch.randn(B, Hkv, S, Dh, generator=g)  # (B, Hkv, S, Dh)
    v = torch.randn(B, Hkv, S, Dh, generator=g)  # (B, Hkv, S, Dh)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def random_mask(shape, seed=0, p=0.7):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) < p


def formula(q, k, v, mask=None):
    """softmax(q k^T / sqrt(Dh)) v with -inf on masked scores, written independently of the library."""
    scores = torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = scores.softmax(-1)  # (B, H, T, S)
    return torch.einsum("bhts,bhsd->bhtd", w, v), w


# --- fast path == explicit path == formula ------------------------------------------------------

@pytest.mark.parametrize("mask_kind", ["none", "key_padding", "full_random", "causal_offset"])
def test_fast_path_equals_explicit_path_and_formula(mask_kind):
    q, k, v = qkv()
    B, H, T, S = q.size(0), q.size(1), q.size(2), k.size(2)
    mask = {
        "none": None,
        "key_padding": padding_mask(torch.tensor([[5, 6, 7, 8, 9, 0, 0], [5, 6, 0, 0, 0, 0, 0]]), 0),
        "full_random": random_mask((B, H, T, S)) | torch.eye(T, S, dtype=torch.bool),
        "causal_offset": causal_mask(T, S, offset=S - T),
    }[mask_kind]
    fast, no_w = scaled_dot_product_attention(q, k, v, mask)
    slow, w = scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert no_w is None
    assert fast.shape == slow.shape == (B, H, T, 8)
    assert w.shape == (B, H, T, S)
    assert_close(fast, slow, **TOL)
    ref_out, ref_w = formula(q, k, v, None if mask is None else mask.expand(B, H, T, S))
    assert_close(slow, ref_out, **TOL)
    assert_close(w, ref_w, **TOL)


def test_is_causal_equals_explicit_causal_mask_on_both_paths():
    q, k, v = qkv(T=6, S=6)
    tril = causal_mask(6)
    ref, _ = scaled_dot_product_attention(q, k, v, tril, need_weights=True)
    fast, _ = scaled_dot_product_attention(q, k, v, AttentionMask(is_causal=True))
    slow, w = scaled_dot_product_attention(q, k, v, AttentionMask(is_causal=True), need_weights=True)
    assert_close(fast, ref, **TOL)
    assert_close(slow, ref, **TOL)
    assert torch.all(w.masked_select(~tril.expand_as(w)) == 0)
    # Row 0 of a causal mask sees only key 0: its output is exactly v[..., 0, :].
    assert_close(fast[:, :, 0], v[:, :, 0], **TOL)


def test_is_causal_is_refused_with_a_mask_or_unequal_lengths():
    q, k, v = qkv(T=4, S=6)
    with pytest.raises(ValueError, match="is_causal"):
        scaled_dot_product_attention(q, k, v, AttentionMask(is_causal=True))
    q, k, v = qkv(T=4, S=4)
    with pytest.raises(ValueError, match="is_causal"):
        AttentionMask(causal_mask(4), is_causal=True)


def test_non_bool_mask_is_refused():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="bool"):
        scaled_dot_product_attention(q, k, v, torch.ones(5, 7))


@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("Hkv", [1, 2])
def test_grouped_query_attention_equals_repeated_heads(Hkv, need_weights):
    q, k, v = qkv(H=4, Hkv=Hkv)
    mask = random_mask((2, 1, 5, 7), seed=3) | torch.eye(5, 7, dtype=torch.bool)
    out, _ = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    n_rep = 4 // Hkv
    # Query head h uses key/value head h // n_rep: check against explicit per-head indexing.
    k_full = torch.stack([k[:, h // n_rep] for h in range(4)], dim=1)  # (B, H, S, Dh)
    v_full = torch.stack([v[:, h // n_rep] for h in range(4)], dim=1)  # (B, H, S, Dh)
    assert_close(repeat_kv(k, n_rep), k_full, atol=0, rtol=0)
    ref, _ = formula(q, k_full, v_full, mask.expand(2, 4, 5, 7))
    assert_close(out, ref, **TOL)


def test_grouped_query_attention_is_causal_fast_equals_explicit():
    q, k, v = qkv(H=6, Hkv=2, T=5, S=5)
    fast, _ = scaled_dot_product_attention(q, k, v, AttentionMask(is_causal=True))
    slow, _ = scaled_dot_product_attention(q, k, v, AttentionMask(is_causal=True), need_weights=True)
    assert_close(fast, slow, **TOL)


@pytest.mark.parametrize("causal", [True, False])
def test_grouped_query_gradients_fast_equal_explicit(causal):
    """The fast path shares key/value heads inside the fused kernel (torch >= 2.5), the explicit
    path repeats them: the gradients of queries, keys and values agree."""
    grads = []
    for need_weights in (False, True):
        q, k, v = (t.clone().requires_grad_() for t in qkv(H=6, Hkv=2, T=5, S=5))
        mask = None if causal else random_mask((2, 1, 5, 5), seed=4) | torch.eye(5, dtype=torch.bool)
        out, _ = scaled_dot_product_attention(q, k, v, AttentionMask(is_causal=True) if causal else mask,
                                              need_weights=need_weights)
        out.pow(2).sum().backward()
        grads.append([q.grad, k.grad, v.grad])
    for fast, slow in zip(*grads):
        assert_close(fast, slow, **TOL)


def test_weight_rows_sum_to_one_and_are_exactly_zero_where_masked():
    q, k, v = qkv()
    mask = random_mask((2, 4, 5, 7), seed=1) | torch.eye(5, 7, dtype=torch.bool)  # every row sees a key
    _, w = scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert_close(w.sum(-1), torch.ones(2, 4, 5), **TOL)
    assert torch.all(w[~mask] == 0.0)
    assert torch.all(w[mask] > 0.0)


# --- fully masked rows ----------------------------------------------------------------------------

def _fully_masked_case():
    mask = random_mask((2, 1, 5, 7), seed=2) | torch.eye(5, 7, dtype=torch.bool)  # (B, 1, T, S)
    mask[0, 0, 1] = False  # query 1 of batch 0 sees nothing
    mask[1, 0, 4] = False  # query 4 of batch 1 sees nothing
    dead = torch.zeros(2, 1, 5, dtype=torch.bool)
    dead[0, 0, 1] = dead[1, 0, 4] = True
    return mask, dead


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("need_weights", [False, True], ids=["fast", "explicit"])
def test_fully_masked_rows_give_zeros_and_finite_gradients(need_weights, autocast):
    q, k, v = qkv(requires_grad=True)
    mask, dead = _fully_masked_case()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, w = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    dead_rows = dead.expand(2, 4, 5)  # (B, H, T)
    assert torch.isfinite(out).all()
    assert torch.all(out[dead_rows] == 0)
    assert out[~dead_rows].abs().sum() > 0
    if need_weights:
        assert torch.isfinite(w).all()
        assert torch.all(w[dead_rows] == 0)
        live = w[~dead_rows].float().sum(-1)
        assert_close(live, torch.ones_like(live), atol=1e-2 if autocast else 1e-5, rtol=0)
    (out.float() ** 2).sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all()
    # A query that sees nothing gets no gradient.
    assert torch.all(q.grad[dead_rows] == 0)


def test_fully_masked_rows_do_not_change_the_other_rows():
    q, k, v = qkv()
    mask, dead = _fully_masked_case()
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    ref, _ = formula(q, k, v, mask.expand(2, 4, 5, 7))  # NaN on the dead rows, exact elsewhere
    live = ~dead.expand(2, 4, 5)
    assert_close(out[live], ref[live], **TOL)
    assert torch.isnan(ref[~live]).all()  # the naive formula does produce NaN there


def test_fully_masked_batch_entry_on_both_paths():
    q, k, v = qkv()
    mask = padding_mask(torch.tensor([[0, 0, 0, 0, 0, 0, 0], [1, 2, 3, 0, 0, 0, 0]]), pad_id=0)
    fast, _ = scaled_dot_product_attention(q, k, v, mask)
    slow, w = scaled_dot_product_attention(q, k, v, mask, need_weights=True)
    assert torch.all(fast[0] == 0) and torch.all(slow[0] == 0) and torch.all(w[0] == 0)
    assert_close(fast, slow, **TOL)


# --- mask helpers ---------------------------------------------------------------------------------

def test_padding_mask_marks_real_tokens():
    ids = torch.tensor([[4, 5, 0, 0], [0, 7, 8, 9]])
    m = padding_mask(ids, pad_id=0)
    assert m.dtype == torch.bool and m.shape == (2, 1, 1, 4)
    assert m[:, 0, 0].tolist() == [[True, True, False, False], [False, True, True, True]]
    assert padding_mask(ids, pad_id=5)[0, 0, 0].tolist() == [True, False, True, True]


def test_key_mask_accepts_int_and_bool():
    am = torch.tensor([[1, 1, 0], [0, 1, 1]])
    assert key_mask(am).tolist() == key_mask(am.bool()).tolist()
    assert key_mask(am).shape == (2, 1, 1, 3) and key_mask(am).dtype == torch.bool
    assert key_mask(am)[:, 0, 0].tolist() == [[True, True, False], [False, True, True]]


def test_causal_mask_is_lower_triangular_without_offset():
    m = causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert torch.equal(m, torch.ones(4, 4, dtype=torch.bool).tril())


def test_causal_mask_with_offset_matches_cache_positions():
    # 3 positions already cached, 2 new queries at absolute positions 3 and 4.
    m = causal_mask(2, offset=3)
    assert m.shape == (2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    # Explicit key_length: query t sees key s iff s <= offset + t.
    m = causal_mask(3, 6, offset=1)
    for t in range(3):
        for s in range(6):
            assert bool(m[t, s]) == (s <= 1 + t)
    # The last rows of a full causal mask are the offset mask.
    assert torch.equal(causal_mask(6)[4:], causal_mask(2, 6, offset=4))


def test_masks_combine_by_and_and_documents_stay_apart():
    p = padding_mask(torch.tensor([[1, 2, 0]]), 0)  # (1, 1, 1, 3)
    c = causal_mask(3)  # (3, 3)
    both = c & p
    assert both.shape == (1, 1, 3, 3)
    assert both[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    # Two packed documents, [0, 0, 1]: the third position sees only itself.
    docs = document_mask(torch.tensor([[0, 0, 1]]))  # (1, 1, 3, 3)
    assert (c & docs)[0, 0].tolist() == [[True, False, False], [True, True, False], [False, False, True]]
