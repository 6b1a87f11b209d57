"""The decode path's shortcuts compute what the plain path computes.

`logits_to_keep=1` (what `generate` asks for) gives the last position's logits of a full forward,
with and without padding and a cache, and the cache ends up the same.
"""

import pytest
import torch

from handformer.config import CausalLMConfig
from handformer.generation.cache import DecodingCache
from handformer.models.causal_lm import CausalLM
from handformer.nn.kv_cache import KVCache
from handformer.nn.masks import AttentionMask, as_attention_mask

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("style", ["gpt2", "llama"])
@torch.no_grad()
def test_logits_to_keep_1_equals_the_last_row_of_all_logits(style):
    build = CausalLMConfig.gpt2_style if style == "gpt2" else CausalLMConfig.llama_style
    torch.manual_seed(0)
    model = CausalLM(build(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2 if style == "llama" else None,
                           d_ff=64, n_layers=2, max_positions=32)).eval()
    ids = torch.randint(0, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False  # left padding
    full = model(ids, mask).logits  # (B, T, V)
    last = model(ids, mask, logits_to_keep=1).logits  # (B, 1, V)
    assert last.shape == (2, 1, 50)
    torch.testing.assert_close(last, full[:, -1:], atol=1e-6, rtol=1e-6)

    cache_a, cache_b = model.new_cache(16), model.new_cache(16)
    model(ids[:, :6], mask[:, :6], cache=cache_a)
    model(ids[:, :6], mask[:, :6], cache=cache_b, logits_to_keep=1)
    step_a = model(ids[:, 6:], mask, cache=cache_a).logits[:, -1:]
    step_b = model(ids[:, 6:], mask, cache=cache_b, logits_to_keep=1).logits
    torch.testing.assert_close(step_b, step_a, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(step_b, full[:, -1:], atol=1e-5, rtol=1e-5)


# --- the per-step shortcuts -----------------------------------------------------------------------

def test_a_mask_object_built_once_equals_the_tensor_mask_checked_per_call():
    """The model builds its AttentionMask once per forward; a plain tensor is checked at every
    call. Both give the same outputs, with and without a row that sees no key."""
    from handformer.nn.attention import scaled_dot_product_attention
    from handformer.nn.masks import has_empty_rows

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 3, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    mask = torch.rand(2, 1, 3, 6, generator=g) < 0.5
    mask[..., 0] = True  # every query row sees key 0
    assert not has_empty_rows(mask)
    per_call, _ = scaled_dot_product_attention(q, k, v, mask)
    built = as_attention_mask(mask)
    assert built.visible_rows is None and built.allowed is mask  # nothing to zero: the mask as given
    assert torch.equal(scaled_dot_product_attention(q, k, v, built)[0], per_call)
    mask[1, 0, 2] = False
    assert has_empty_rows(mask)
    built = as_attention_mask(mask)
    assert built.visible_rows is not None
    out = scaled_dot_product_attention(q, k, v, built)[0]
    assert torch.equal(out, scaled_dot_product_attention(q, k, v, mask)[0])
    assert torch.all(out[1, :, 2] == 0) and torch.isfinite(out).all()


@torch.no_grad()
def test_a_decoding_step_builds_no_causal_mask():
    """One new token sees every cached key: the model hands the layers no mask without padding,
    only the padding mask with it, and none for a rolling sliding-window cache that is full."""
    torch.manual_seed(0)
    model = CausalLM(CausalLMConfig.llama_style(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64,
                                                n_layers=1, max_positions=32)).eval()
    cache = model.new_cache(16)
    cache.advance(5)
    assert model.build_mask(1, 5, None, cache, torch.device("cpu")) == AttentionMask()
    padding = torch.tensor([[0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    mask = model.build_mask(1, 5, padding, cache, torch.device("cpu"))
    assert not mask.is_causal and torch.equal(mask.allowed, padding[:, None, None, :])

    windowed = CausalLM(CausalLMConfig.llama_style(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2,
                                                   d_ff=64, n_layers=1, max_positions=32,
                                                   sliding_window=4)).eval()
    rolling = windowed.new_cache(16)
    rolling.advance(9)
    assert windowed.build_mask(1, 9, None, rolling, torch.device("cpu")) == AttentionMask()
    plain = KVCache(1, 16)  # keeps every position: the window must be masked
    plain.advance(9)
    mask = windowed.build_mask(1, 9, None, plain, torch.device("cpu"))
    assert mask.allowed.tolist() == [[False] * 6 + [True] * 4]


def test_generate_decodes_a_small_model_with_one_thread_and_restores_the_setting():
    from handformer.generation.generate import generate
    from handformer.inference.threads import default_threads

    tiny = CausalLM(CausalLMConfig.llama_style(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64,
                                               n_layers=1, max_positions=32))
    big = CausalLM(CausalLMConfig.gpt2_style(vocab_size=50, d_model=512, n_heads=4, d_ff=1024, n_layers=1,
                                             max_positions=32))
    assert default_threads(tiny) == 1 and default_threads(big) is None
    seen = []
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # this module runs with one (the `one_thread` fixture)
    try:
        generate(tiny, [[1, 2]], 2, temperature=0, on_token=lambda *_: seen.append(torch.get_num_threads()))
        assert seen == [1, 1] and torch.get_num_threads() == 2
        generate(tiny, [[1, 2]], 1, temperature=0, threads=None,
                 on_token=lambda *_: seen.append(torch.get_num_threads()))
        assert seen[-1] == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads must be"):
        generate(tiny, [[1, 2]], 1, threads=0)


def test_reorder_selects_the_filled_rows_and_keeps_the_capacity():
    cache = DecodingCache(n_layers=2, max_length=10)
    g = torch.Generator().manual_seed(0)
    for i in range(2):
        cache.layer(i).update(torch.randn(3, 2, 4, 5, generator=g), torch.randn(3, 2, 4, 5, generator=g))
    cache.advance(4)
    cache.cross[0] = (torch.randn(3, 2, 6, 5, generator=g), torch.randn(3, 2, 6, 5, generator=g))
    keys, values, cross = list(cache.keys), list(cache.values), cache.cross[0]
    index = torch.tensor([2, 0, 0])
    cache.reorder(index)
    for i in range(2):
        assert cache.keys[i].shape == (3, 2, 10, 5)  # room for 6 more positions
        assert torch.equal(cache.keys[i][:, :, :4], keys[i][index, :, :4])
        assert torch.equal(cache.values[i][:, :, :4], values[i][index, :, :4])
    assert torch.equal(cache.cross[0][0], cross[0][index])
    cache.reorder(torch.tensor([1]), cross=False)  # fewer rows; cross keys/values left as they are
    assert cache.keys[0].shape == (1, 2, 10, 5) and cache.cross[0][0].shape == (3, 2, 6, 5)
    assert torch.equal(cache.keys[0][:, :, :4], keys[0][[0], :, :4])
    k, v = cache.layer(0).update(torch.ones(1, 2, 1, 5), torch.ones(1, 2, 1, 5))
    assert k.shape == (1, 2, 5, 5) and torch.equal(k[:, :, :4], keys[0][[0], :, :4])
