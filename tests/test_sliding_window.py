"""Sliding-window attention and its rolling KV cache, and the other per-family model settings
(head_dim, qkv_bias, the Gemma norm and embedding scale), checked inside handformer: the cache gives
the same logits as no cache however the tokens are fed, its memory stays at the window's size, and
the window changes exactly the positions it should. Parity with Hugging Face is in
test_hf_families.py."""

import pytest
import torch

from handformer import CausalLM
from handformer.config import CausalLMConfig, Llama3RopeScaling, Seq2SeqConfig, config_from_dict
from handformer.generation.generate import generate
from handformer.nn.embedding import TokenEmbedding
from handformer.nn.kv_cache import KVCache
from handformer.nn.masks import causal_mask
from handformer.nn.norms import OffsetRMSNorm
from handformer.nn.rolling_kv_cache import RollingKVCache

pytestmark = pytest.mark.usefixtures("one_thread")

W = 4


def _model(window=W, **overrides):
    torch.manual_seed(0)
    cfg = CausalLMConfig.llama_style(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48,
                                     n_layers=2, max_positions=96, sliding_window=window, **overrides)
    return CausalLM(cfg).eval()


def test_window_mask_is_a_band():
    mask = causal_mask(3, 6, offset=3, window=3)  # queries at positions 3, 4, 5
    assert mask.int().tolist() == [[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]
    assert torch.equal(causal_mask(5, window=5), causal_mask(5))  # a window as long as the sequence


@pytest.mark.parametrize("chunks", [[1] * 13, [3, 1, 1, 6, 2], [9, 4], [2, 7, 1, 3]])
def test_rolling_cache_hands_out_the_positions_it_says(chunks):
    """Keys whose values are their own positions come back in `key_positions` order, the buffer
    holds W slots, and every key a query may see (the last W positions) is among them."""
    cache = RollingKVCache(n_layers=1, max_length=64, window=W)
    layer = cache.layer(0)
    for T in chunks:
        start = cache.length
        positions = cache.key_positions(T)
        k = torch.arange(start, start + T, dtype=torch.float32).view(1, 1, T, 1)  # (B, Hkv, T, Dh)
        keys, _ = layer.update(k, k.clone())
        expected = torch.arange(start + T) if positions is None else positions
        assert keys[0, 0, :, 0].tolist() == expected.tolist()
        assert set(range(max(0, start - W + 1), start + T)) <= set(expected.tolist())  # all needed
        cache.advance(T)
        assert cache.keys[0].shape == (1, 1, W, 1)


@torch.no_grad()
@pytest.mark.parametrize("chunks", [[1] * 30, [5, 1, 1, 9, 3, 11], [30]])
def test_cached_logits_equal_uncached_beyond_the_window(chunks):
    model = _model()
    ids = torch.randint(0, 50, (2, 30), generator=torch.Generator().manual_seed(1))  # 7.5 windows
    mask = torch.ones(2, 30, dtype=torch.long)
    mask[1, :4] = 0  # row 1 left-padded
    expected = model(ids, attention_mask=mask).logits
    cache, got, start = model.new_cache(), [], 0
    for T in chunks:
        got.append(model(ids[:, start:start + T], attention_mask=mask[:, :start + T], cache=cache).logits)
        start += T
        assert all(k.shape[2] == W for k in cache.keys)  # rolling: never more than the window
    torch.testing.assert_close(torch.cat(got, dim=1)[mask.bool()], expected[mask.bool()], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_the_window_changes_exactly_the_positions_past_it():
    windowed, full = _model(), _model(window=None)
    full.load_state_dict(windowed.state_dict())
    ids = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(2))
    a, b = windowed(ids).logits, full(ids).logits
    torch.testing.assert_close(a[:, :W], b[:, :W], atol=0, rtol=0)  # the first W see everything anyway
    assert (a[:, W:] - b[:, W:]).abs().amax(-1).min() > 1e-3  # every later position sees less


@torch.no_grad()
def test_generation_memory_does_not_grow_with_length():
    """100 new tokens (25 windows): the cache generate uses keeps W slots a layer, and the tokens
    equal generation without a cache."""
    model = _model()
    caches = []
    new_cache = model.new_cache
    model.new_cache = lambda *a: caches.append(new_cache(*a)) or caches[-1]
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12]]
    with_cache = generate(model, prompts, 80, temperature=0)
    assert [k.shape for k in caches[0].keys] == [(2, 2, W, 8)] * 2
    assert caches[0].length == 6 + 79
    assert with_cache == generate(model, prompts, 80, temperature=0, use_cache=False)


def test_cache_window_must_match_the_model():
    model = _model()
    with pytest.raises(ValueError, match="rolls over a window of 3 positions but the model's sliding_window is 4"):
        model(torch.tensor([[1, 2]]), cache=RollingKVCache(2, 16, window=3))
    plain = _model(window=None)
    with pytest.raises(ValueError, match="sliding_window is None"):
        plain(torch.tensor([[1, 2]]), cache=RollingKVCache(2, 16, window=3))
    ids = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(3))
    big = KVCache(2, 16)  # a plain cache is allowed: it keeps everything, the mask still slides
    torch.testing.assert_close(torch.cat([model(ids[:, :6], cache=big).logits, model(ids[:, 6:], cache=big).logits], 1),
                               model(ids).logits, atol=1e-5, rtol=1e-5)


# --- the other family settings --------------------------------------------------------------------

def test_head_dim_is_a_field_derived_when_absent():
    cfg = CausalLMConfig.llama_style(d_model=32, n_heads=4)
    assert cfg.head_dim == 8 and cfg.to_dict()["head_dim"] is None  # saved as "derive it"
    wide = CausalLMConfig.llama_style(d_model=32, n_heads=4, head_dim=12)
    assert config_from_dict(wide.to_dict()) == wide and wide.to_dict()["head_dim"] == 12
    model = CausalLM(wide)
    assert model.layers[0].self_attn.q_proj.weight.shape == (4 * 12, 32)
    assert model.layers[0].self_attn.o_proj.weight.shape == (32, 4 * 12)
    assert model.rotary.cos.shape[-1] == 12
    assert model(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, wide.vocab_size)
    edited = {**cfg.to_dict(), "d_model": 64}  # an edited saved config derives head_dim again
    assert config_from_dict(edited).head_dim == 16
    for bad, field in [({"head_dim": 0}, "head_dim"), ({"head_dim": 7}, "head_dim"),
                       ({"sliding_window": 0}, "sliding_window"), ({"sliding_window": 2.5}, "sliding_window")]:
        with pytest.raises(ValueError, match=rf"CausalLMConfig\.{field}="):
            CausalLMConfig.llama_style(d_model=32, n_heads=4, **bad)
    seq2seq = Seq2SeqConfig(d_model=32, n_heads=4, head_dim=16, d_ff=64, src_vocab_size=10, tgt_vocab_size=10)
    assert seq2seq.head_dim == 16


def test_rope_scaling_field():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_positions": 64}
    cfg = CausalLMConfig.llama_style(d_model=32, n_heads=4, rope_scaling=scaling)
    assert cfg.rope_scaling == Llama3RopeScaling(**scaling)
    assert config_from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"rope_scaling\.high_freq_factor=1\.0 is invalid: it must be larger"):
        CausalLMConfig.llama_style(rope_scaling={**scaling, "high_freq_factor": 1.0})
    assert CausalLMConfig.llama_style(rope_scaling={**scaling, "type": "llama3"}) == cfg.__class__.llama_style(
        rope_scaling=scaling)  # saved configs name the type; older ones (without) are Llama 3's
    with pytest.raises(ValueError, match=r"rope_scaling\] type='dynamic' is invalid: choose one of llama3, linear"):
        CausalLMConfig.llama_style(rope_scaling={**scaling, "type": "dynamic"})
    with pytest.raises(ValueError, match=r"CausalLMConfig\.rope_scaling=.* needs position=\"rope\""):
        CausalLMConfig.gpt2_style(rope_scaling=Llama3RopeScaling())


def test_qkv_bias_puts_biases_on_q_k_v_only():
    attn = _model(window=None, qkv_bias=True).layers[0].self_attn
    assert all(getattr(attn, p).bias is not None for p in ("q_proj", "k_proj", "v_proj"))
    assert attn.o_proj.bias is None


def test_offset_norm_and_scaled_embeddings_in_bfloat16():
    norm = OffsetRMSNorm(8)
    torch.testing.assert_close(norm(torch.full((2, 8), 3.0)), torch.ones(2, 8))  # weight 0: gain 1
    x = torch.randn(3, 8).bfloat16()
    with torch.no_grad():
        norm.weight.normal_()
    expected = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)) * (1 + norm.weight)
    assert torch.equal(norm(x), expected.bfloat16())  # the gain is applied in float32, then cast
    embed = TokenEmbedding(3, 3072, scale=True).bfloat16()
    ids = torch.tensor([[0, 2]])
    # sqrt(3072) = 55.43 rounds to 55.5 in bfloat16, and that is the factor (Gemma's rule)
    assert torch.equal(embed(ids), embed.weight[ids] * torch.tensor(55.5, dtype=torch.bfloat16))
    model = _model(window=None, norm="rmsnorm_offset")
    assert all(torch.equal(p, torch.zeros_like(p)) for n, p in model.named_parameters() if "norm" in n)

