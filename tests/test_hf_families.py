"""Parity with tiny random Hugging Face models of the families beyond GPT-2 and Llama: Qwen2, Mistral
(with and without a sliding window), Gemma, Phi-3, SmolLM (Llama with 9 query / 3 key-value heads,
tied) and Llama 3.x rope scaling.

Each model is built from a config (no download), every parameter randomized, imported with
handformer.convert.hf_weights, then compared with Hugging Face: logits at every position, batched
left-padded prompts, and greedy generation with and without the KV cache, token for token. The
sliding windows are a few positions wide and the sequences run several windows beyond them.
"""

import copy

import pytest
import torch
from helpers import randomize_hf

transformers = pytest.importorskip("transformers")

from handformer.convert.hf_weights import config_from_hf, model_from_hf  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.inference.fuse import FusedSelfAttention  # noqa: E402
from handformer.inference.packed_linear import pack_linears  # noqa: E402
from handformer.inference.prepare import prepare_for_decoding  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 101
WINDOW = 5  # sliding windows; sequences below are 3 to 6 windows long
SIZE = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, num_hidden_layers=2, max_position_embeddings=64,
            attention_dropout=0.0, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            attn_implementation="eager")


def _qwen2():
    # sliding_window is set but use_sliding_window is false: Hugging Face attends to everything.
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SIZE, tie_word_embeddings=True, rms_norm_eps=1e-6, use_sliding_window=False, sliding_window=3,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}))


def _mistral(window):
    return transformers.MistralForCausalLM(transformers.MistralConfig(
        **SIZE, sliding_window=window, rope_parameters={"rope_type": "default", "rope_theta": 1e4}))


def _gemma():
    size = {**SIZE, "num_key_value_heads": 1}
    # head_dim 24 while hidden_size / heads = 16; "gelu" is Gemma's legacy name for the tanh GELU.
    return transformers.GemmaForCausalLM(transformers.GemmaConfig(
        **size, head_dim=24, hidden_act="gelu", rope_parameters={"rope_type": "default", "rope_theta": 1e4}))


def _phi3():
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZE, sliding_window=WINDOW, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4}))


def _smollm():
    size = {**SIZE, "hidden_size": 72, "num_attention_heads": 9, "num_key_value_heads": 3}
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **size, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4}))


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _llama3():
    # head_dim 16: wavelengths 6.3 (kept, < 64 / 4), 32.8 (blended) and the rest (> 64, scaled).
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{**SIZE, "max_position_embeddings": 128}, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE))


BUILDERS = {"qwen2": _qwen2, "mistral_window": lambda: _mistral(WINDOW), "mistral_no_window": lambda: _mistral(None),
            "gemma": _gemma, "phi3": _phi3, "smollm": _smollm, "llama3": _llama3}


@pytest.fixture(scope="module", params=list(BUILDERS))
def pair(request):
    torch.manual_seed(sorted(BUILDERS).index(request.param))
    hf_model = randomize_hf(BUILDERS[request.param](), 0.15)
    ours = model_from_hf(hf_model.config.to_dict(), hf_model.state_dict()).eval()
    return request.param, hf_model, ours


def _left_padded(lengths, total, seed=1):
    ids = torch.randint(3, VOCAB, (len(lengths), total), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, total - n:] = 1
    return ids * mask, mask


@torch.no_grad()
def test_logits_match_at_every_position(pair):
    _, hf_model, ours = pair
    ids = torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(2))  # 4.8 windows
    expected = hf_model(ids).logits
    assert expected.std() > 0.5  # far from trivial, so 1e-5 agreement means something
    torch.testing.assert_close(ours(ids).logits, expected, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_logits_match_with_left_padding(pair):
    _, hf_model, ours = pair
    ids, mask = _left_padded([20, 13, 7], 20)
    real = mask.bool()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    expected = hf_model(ids, attention_mask=mask, position_ids=position_ids).logits
    got = ours(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_greedy_generation_matches_batched_and_left_padded(pair):
    """Prompts of 9, 4 and 6 tokens continued by 20 tokens (several windows past the prompt), in one
    left-padded batch, with the KV cache (rolling for the sliding-window models) and without."""
    name, hf_model, ours = pair
    ids, mask = _left_padded([9, 4, 6], 9, seed=3)
    new = 20
    hf_model.generation_config.eos_token_id = None  # no early stop: compare every token
    out = hf_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0)
    expected = out[:, ids.size(1):].tolist()
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    assert generate(ours, prompts, new, temperature=0) == expected
    assert generate(ours, prompts, new, temperature=0, use_cache=False) == expected
    assert len({tuple(t) for t in expected}) == 3  # the rows differ: padding cannot hide a mix-up


@torch.no_grad()
def test_prepared_model_generates_the_same(pair):
    """What `handformer generate` runs: the model fused (one Q/K/V and one gate/up matrix) and, here
    with every size allowed, packed for oneDNN; the same 20 greedy tokens as Hugging Face."""
    _, hf_model, ours = pair
    prepared = prepare_for_decoding(copy.deepcopy(ours))
    pack_linears(prepared, min_bytes=0)
    assert any(isinstance(m, FusedSelfAttention) for m in prepared.modules())
    ids, mask = _left_padded([9, 4, 6], 9, seed=3)
    hf_model.generation_config.eos_token_id = None
    out = hf_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0)
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    assert generate(prepared, prompts, 20, temperature=0) == out[:, ids.size(1):].tolist()
    torch.testing.assert_close(prepared(ids, attention_mask=mask).logits[mask.bool()],
                               ours(ids, attention_mask=mask).logits[mask.bool()], atol=1e-5, rtol=1e-5)


def test_configs_carry_each_familys_variation(pair):
    name, hf_model, ours = pair
    cfg = ours.cfg
    assert cfg.position == "rope" and cfg.norm_placement == "pre" and cfg.dropout == 0.0
    expected = {
        "qwen2": dict(qkv_bias=True, bias=False, tie_embeddings=True, rope_theta=1e6, norm_eps=1e-6,
                      sliding_window=None),
        "mistral_window": dict(sliding_window=WINDOW, bias=False, qkv_bias=False, tie_embeddings=False),
        "mistral_no_window": dict(sliding_window=None),
        "gemma": dict(head_dim=24, n_kv_heads=1, norm="rmsnorm_offset", activation="geglu_tanh",
                      scale_embeddings=True, tie_embeddings=True),
        "phi3": dict(sliding_window=WINDOW, tie_embeddings=False, activation="swiglu", norm_eps=1e-5),
        "smollm": dict(n_heads=9, n_kv_heads=3, head_dim=8, tie_embeddings=True),
        "llama3": dict(rope_theta=5e5),
    }[name]
    assert {k: getattr(cfg, k) for k in expected} == expected
    if name == "smollm":
        assert ours.layers[0].self_attn.k_proj.weight.shape == (3 * 8, 72)  # GQA: 3 key/value heads
    if name == "phi3":  # the fused projections were split: q, k, v rows, then gate, up rows
        layer = hf_model.model.layers[0]
        fused = torch.cat([ours.layers[0].self_attn.q_proj.weight, ours.layers[0].self_attn.k_proj.weight,
                           ours.layers[0].self_attn.v_proj.weight])
        assert torch.equal(fused, layer.self_attn.qkv_proj.weight)
        assert torch.equal(torch.cat([ours.layers[0].ffn.gate_proj.weight, ours.layers[0].ffn.up_proj.weight]),
                           layer.mlp.gate_up_proj.weight)


def test_llama3_frequencies_equal_hugging_faces():
    """The rotary frequencies themselves: Hugging Face's llama3 inverse frequencies, bit for bit."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from handformer.nn.positions import llama3_inv_freq

    hf_config = _llama3().config
    expected, attention_scale = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    assert attention_scale == 1.0
    cfg = config_from_hf(hf_config.to_dict())
    plain = 1.0 / 5e5 ** (torch.arange(0, 16, 2, dtype=torch.int64).float() / 16)  # (Dh/2,)
    inv_freq = llama3_inv_freq(plain, cfg.rope_scaling)
    assert torch.equal(inv_freq, expected)
    assert inv_freq[0] == plain[0] and inv_freq[-1] == plain[-1] / 8  # kept, and slowed by factor
    assert plain[1] / 8 < inv_freq[1] < plain[1]  # blended
    ours = model_from_hf(hf_config.to_dict(), randomize_hf(_llama3(), 0.1).state_dict())
    angles = torch.outer(torch.arange(cfg.max_positions).float(), expected)  # (P, Dh/2)
    assert torch.equal(ours.rotary.cos[:, :8], angles.cos())


# --- refusals: settings handformer does not implement, named by key and value ----------------------

def _hf(builder):
    return builder().config.to_dict()


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gemma2", "attn_logit_softcapping": 50.0},
     "gemma2 config has attn_logit_softcapping=50.0: soft-capping of attention scores"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0: soft-capping of the output logits"),
    ({"layer_types": ["sliding_attention", "full_attention"]},
     "layer_types=['sliding_attention', 'full_attention']: layers that alternate"),
    ({"use_qk_norm": True}, "use_qk_norm=True: normalising queries and keys"),
    ({"num_local_experts": 8}, "num_local_experts=8: mixture-of-experts"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5: rotary embeddings on part of each head"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
     "rope scaling type 'yarn' is not implemented"),
    ({"model_type": "qwen3"}, "unsupported model_type 'qwen3' (Qwen3 normalises queries and keys"),
])
def test_unimplemented_settings_are_named(change, message):
    with pytest.raises(ValueError) as err:
        config_from_hf({**_hf(lambda: _mistral(WINDOW)), **change})
    assert message in str(err.value)


def test_qwen2_sliding_window_only_when_asked_and_on_every_layer():
    hf = _hf(_qwen2)
    assert config_from_hf({**hf, "sliding_window": 4096}).sliding_window is None  # use_sliding_window false
    on = {k: v for k, v in hf.items() if k != "layer_types"}
    on.update(use_sliding_window=True, sliding_window=4)
    assert config_from_hf({**on, "max_window_layers": 0}).sliding_window == 4
    assert config_from_hf({**on, "max_window_layers": 2}).sliding_window is None  # no layer slides
    with pytest.raises(ValueError, match=r"max_window_layers=1: a sliding window on layers 1\.\. of 2"):
        config_from_hf({**on, "max_window_layers": 1})


def test_gemma_activation_and_bias_checks():
    hf = _hf(_gemma)
    assert config_from_hf({**hf, "hidden_act": "gelu_pytorch_tanh"}).activation == "geglu_tanh"
    with pytest.raises(ValueError, match="hidden_act='relu'"):
        config_from_hf({**hf, "hidden_act": "relu"})
    with pytest.raises(ValueError, match="attention_bias=True"):
        config_from_hf({**hf, "attention_bias": True})


def test_gemma_norm_and_embedding_scale_match_in_bfloat16():
    """In bfloat16 Gemma rounds sqrt(d_model) to the dtype (sqrt(3072) -> 55.5) and applies the
    norm's 1 + w gain in float32: the same bits as Hugging Face's modules."""
    from transformers.models.gemma import modeling_gemma

    from handformer.nn.embedding import TokenEmbedding
    from handformer.nn.norms import OffsetRMSNorm

    torch.manual_seed(0)
    hf_embed = modeling_gemma.GemmaTextScaledWordEmbedding(7, 3072, 0, embed_scale=3072 ** 0.5).bfloat16()
    ours = TokenEmbedding(7, 3072, scale=True).bfloat16()
    ours.weight.data.copy_(hf_embed.weight.data)
    ids = torch.tensor([[1, 5, 6]])
    assert torch.equal(ours(ids), hf_embed(ids))
    hf_norm, norm = modeling_gemma.GemmaRMSNorm(64, eps=1e-6), OffsetRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        hf_norm.weight.normal_()
        norm.weight.copy_(hf_norm.weight)
    x = (3 * torch.randn(2, 5, 64)).bfloat16()
    assert torch.equal(norm(x), hf_norm(x))


@pytest.mark.parametrize("config_class, overrides", [
    ("Qwen2Config", {"tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 131072}),
    ("MistralConfig", {}),  # Mistral 7B: 4096-token window, 8 key/value heads
    ("GemmaConfig", {}),  # Gemma 7B: 16 heads of 256 for hidden_size 3072
    ("Phi3Config", {"sliding_window": 2047}),  # Phi-3 mini 4k
    ("LlamaConfig", {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
                     "intermediate_size": 1536, "num_hidden_layers": 30, "vocab_size": 49152,
                     "tie_word_embeddings": True}),  # SmolLM2 135M's shape
    ("LlamaConfig", {"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "intermediate_size": 8192, "num_hidden_layers": 16, "vocab_size": 128256,
                     "tie_word_embeddings": True, "max_position_embeddings": 1024,
                     "rope_parameters": {**LLAMA3_ROPE, "factor": 32.0, "original_max_position_embeddings": 8192}}),
])
def test_full_size_configs_give_the_same_parameter_count(config_class, overrides):
    """The families at their released sizes (transformers' defaults), built on the meta device: no
    memory, but every shape. Same parameter count as Hugging Face's model, and the weight map fits."""
    from handformer import CausalLM
    from handformer.convert.hf_weights import convert_hf_state_dict

    hf_config = getattr(transformers, config_class)(**overrides)
    cfg = config_from_hf(hf_config.to_dict())
    with torch.device("meta"):
        hf_model = getattr(transformers, config_class.replace("Config", "ForCausalLM"))(hf_config)
        ours = CausalLM(cfg)
    assert ours.num_parameters() == sum(p.numel() for p in hf_model.parameters())
    state = {k: v for k, v in hf_model.state_dict().items() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    assert convert_hf_state_dict(state, cfg, hf_config.model_type).keys() == ours.state_dict().keys()
