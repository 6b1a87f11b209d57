"""Parity with tiny random Hugging Face GPT-2 and Llama models, and the importer's strict checks.

The Hugging Face models are built from a config (no download), every parameter is randomized
(their init leaves norms at 1 and biases at 0, which would hide a swapped mapping), the weights
are imported with handformer.convert.hf_weights, and the logits must agree to 1e-5 on real positions.
"""

import re

import pytest
import torch
from helpers import randomize_hf, require_module

transformers = require_module("transformers", "pip install -e '.[dev]'")

from handformer import CausalLM  # noqa: E402
from handformer.convert.hf_weights import (  # noqa: E402
    config_from_hf,
    convert_hf_state_dict,
    load_hf_into,
    model_from_hf,
)

VOCAB = 101


def _gpt2(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    return randomize_hf(transformers.GPT2LMHeadModel(cfg), 0.15)


def _llama(tied, bias=False, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=96, num_hidden_layers=2,
                                   max_position_embeddings=64, tie_word_embeddings=tied,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                                   attention_bias=bias, mlp_bias=bias,
                                   attention_dropout=0.0, bos_token_id=1, eos_token_id=2,
                                   attn_implementation="eager")
    return randomize_hf(transformers.LlamaForCausalLM(cfg), 0.15)


BUILDERS = {"gpt2": _gpt2, "llama_untied": lambda: _llama(False), "llama_tied": lambda: _llama(True),
            "llama_bias": lambda: _llama(False, bias=True)}


def _ours(hf_model):
    return model_from_hf(hf_model.config.to_dict(), hf_model.state_dict()).eval()


def _batch(lengths, total, left):
    """Random ids and a (B, total) mask with `lengths` real tokens, padded right or left with id 0."""
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (len(lengths), total))
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for b, n in enumerate(lengths):
        if left:
            mask[b, total - n:] = 1
        else:
            mask[b, :n] = 1
    return ids * mask, mask


@pytest.fixture(scope="module", params=list(BUILDERS))
def pair(request):
    hf_model = BUILDERS[request.param]()
    return hf_model, _ours(hf_model)


@torch.no_grad()
def test_logits_match_without_padding(pair):
    hf_model, ours = pair
    ids = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(2))
    expected = hf_model(ids).logits
    got = ours(ids).logits
    assert got.shape == expected.shape == (3, 12, VOCAB)
    assert expected.std() > 0.5  # the logits are far from trivial, so 1e-5 agreement means something
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_logits_match_with_right_padding(pair):
    hf_model, ours = pair
    ids, mask = _batch([12, 9, 8], 12, left=False)
    real = mask.bool()
    expected = hf_model(ids, attention_mask=mask).logits
    got = ours(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_logits_match_with_left_padding(pair):
    hf_model, ours = pair
    ids, mask = _batch([12, 10, 8], 12, left=True)
    real = mask.bool()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    expected = hf_model(ids, attention_mask=mask, position_ids=position_ids).logits
    got = ours(ids, attention_mask=mask).logits  # positions are counted from the mask
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)
    # The left-padded rows agree with the same prompts run alone, unpadded.
    for b in range(ids.size(0)):
        alone = ours(ids[b:b + 1, mask[b].bool()]).logits[0]
        torch.testing.assert_close(got[b][real[b]], alone, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_parity_is_sensitive_to_a_wrong_mapping():
    hf_model = _gpt2()
    ours = _ours(hf_model)
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(3))
    attn = ours.layers[0].self_attn
    attn.q_proj.weight.copy_(attn.k_proj.weight.clone())  # as if c_attn were split in the wrong order
    assert (ours(ids).logits - hf_model(ids).logits).abs().max() > 1e-2


def test_config_from_hf_gpt2():
    hf = _gpt2().config.to_dict()
    cfg = config_from_hf(hf)
    assert (cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.vocab_size, cfg.max_positions) == (64, 4, 2, VOCAB, 64)
    assert cfg.d_ff == 4 * 64 and cfg.activation == "gelu_tanh" and cfg.norm == "layernorm"
    assert cfg.position == "learned" and cfg.tie_embeddings and cfg.bias
    assert cfg.dropout == 0.0 and cfg.attention_dropout == 0.0
    assert config_from_hf({**hf, "n_inner": 96}).d_ff == 96
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        config_from_hf({**hf, "scale_attn_by_inverse_layer_idx": True})


def test_config_from_hf_llama():
    hf = _llama(tied=False).config.to_dict()
    cfg = config_from_hf(hf)
    assert (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.n_layers) == (64, 4, 2, 96, 2)
    assert cfg.position == "rope" and cfg.rope_theta == 1000.0 and cfg.activation == "swiglu"
    assert cfg.norm == "rmsnorm" and cfg.norm_eps == hf["rms_norm_eps"] and not cfg.bias
    assert not cfg.tie_embeddings and cfg.dropout == 0.0
    # Older config.json files keep rope_theta at the top level with rope_scaling: null.
    legacy = {k: v for k, v in hf.items() if k != "rope_parameters"}
    assert config_from_hf({**legacy, "rope_theta": 500000.0, "rope_scaling": None}).rope_theta == 500000.0
    llama3 = config_from_hf({**legacy, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 32}}).rope_scaling
    assert (llama3.factor, llama3.low_freq_factor, llama3.high_freq_factor, llama3.original_max_positions) \
        == (8.0, 1.0, 4.0, 32)
    with pytest.raises(ValueError, match="rope scaling type 'linear' is not implemented"):
        config_from_hf({**hf, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}})
    with pytest.raises(ValueError, match="rope scaling type 'dynamic' is not implemented"):
        config_from_hf({**legacy, "rope_scaling": {"type": "dynamic", "factor": 2.0}})
    assert config_from_hf({**hf, "head_dim": 32}).head_dim == 32  # wider heads (q_proj: 4 x 32 rows)
    with pytest.raises(ValueError, match="mlp_bias"):
        config_from_hf({**hf, "attention_bias": True, "mlp_bias": False})


def test_unknown_model_type_is_named():
    with pytest.raises(ValueError, match=r"unsupported model_type 'bert'.*gpt2, llama"):
        config_from_hf({"model_type": "bert", "hidden_size": 64})
    cfg = config_from_hf(_gpt2().config.to_dict())
    with pytest.raises(ValueError, match=r"unsupported model_type 'falcon'.*gpt2, llama"):
        convert_hf_state_dict({}, cfg, "falcon")


@pytest.fixture(scope="module")
def gpt2_state():
    hf_model = _gpt2()
    return hf_model.state_dict(), config_from_hf(hf_model.config.to_dict())


def test_missing_key_is_named(gpt2_state):
    state, cfg = gpt2_state
    state = {k: v for k, v in state.items() if k != "transformer.h.1.mlp.c_fc.bias"}
    with pytest.raises(ValueError, match=r"missing keys \(1\): transformer\.h\.1\.mlp\.c_fc\.bias"):
        convert_hf_state_dict(state, cfg, "gpt2")


def test_unexpected_key_is_named(gpt2_state):
    state, cfg = gpt2_state
    extra = {**state, "transformer.h.2.ln_1.weight": torch.ones(64), "score.weight": torch.ones(2, 64)}
    with pytest.raises(ValueError, match=r"unexpected keys \(2\): transformer\.h\.2\.ln_1\.weight, score\.weight"):
        convert_hf_state_dict(extra, cfg, "gpt2")


def test_wrong_shape_is_named(gpt2_state):
    state, cfg = gpt2_state
    bad = {**state, "transformer.wte.weight": torch.zeros(VOCAB + 1, 64),
           "transformer.h.0.attn.c_attn.weight": torch.zeros(192, 64)}  # a Linear layout, not Conv1D
    with pytest.raises(ValueError) as err:
        convert_hf_state_dict(bad, cfg, "gpt2")
    msg = str(err.value)
    assert "shape mismatches (2)" in msg
    assert f"transformer.wte.weight: checkpoint ({VOCAB + 1}, 64), expected ({VOCAB}, 64)" in msg
    assert "transformer.h.0.attn.c_attn.weight: checkpoint (192, 64), expected (64, 192)" in msg


def test_all_problems_are_listed_together(gpt2_state):
    state, cfg = gpt2_state
    state = {k: v for k, v in state.items() if not k.startswith("transformer.ln_f")}
    state["transformer.wpe.weight"] = torch.zeros(32, 64)
    state["transformer.h.0.attn.extra"] = torch.zeros(1)
    with pytest.raises(ValueError) as err:
        convert_hf_state_dict(state, cfg, "gpt2")
    msg = str(err.value)
    assert re.search(r"missing keys \(2\): transformer\.ln_f\.weight, transformer\.ln_f\.bias", msg)
    assert "unexpected keys (1): transformer.h.0.attn.extra" in msg
    assert "shape mismatches (1): transformer.wpe.weight" in msg


def test_llama_key_with_wrong_layer_count_and_gqa_shape():
    hf_model = _llama(tied=False)
    state, hf = hf_model.state_dict(), hf_model.config.to_dict()
    one_layer = config_from_hf({**hf, "num_hidden_layers": 1})
    with pytest.raises(ValueError, match=r"unexpected keys \(9\): model\.layers\.1\.self_attn\.q_proj\.weight"):
        convert_hf_state_dict(state, one_layer, "llama")
    full_mha = config_from_hf({**hf, "num_key_value_heads": 4})
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight: checkpoint \(32, 64\), "
                                         r"expected \(64, 64\)"):
        convert_hf_state_dict(state, full_mha, "llama")


def test_tied_head_may_be_absent_but_must_equal_the_embedding():
    hf_model = _llama(tied=True)
    state, cfg = hf_model.state_dict(), config_from_hf(hf_model.config.to_dict())
    assert torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])
    without_head = {k: v for k, v in state.items() if k != "lm_head.weight"}  # as safetensors saves it
    ours = CausalLM(cfg)
    load_hf_into(ours, without_head, "llama")
    assert ours.lm_head.weight is ours.embed.weight
    torch.testing.assert_close(ours.embed.weight, state["model.embed_tokens.weight"], atol=0, rtol=0)
    with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens.weight"):
        convert_hf_state_dict({**state, "lm_head.weight": state["lm_head.weight"] + 1}, cfg, "llama")
    untied = config_from_hf({**hf_model.config.to_dict(), "tie_word_embeddings": False})
    with pytest.raises(ValueError, match=r"missing keys \(1\): lm_head\.weight"):
        convert_hf_state_dict(without_head, untied, "llama")


@torch.no_grad()
def test_old_checkpoint_layouts_load(gpt2_state):
    """Buffers older transformers versions saved are ignored; base-model keys lack the prefix."""
    state, cfg = gpt2_state
    buffers = {f"transformer.h.{i}.attn.{name}": torch.zeros(1) for i in range(2) for name in ("bias", "masked_bias")}
    reference = convert_hf_state_dict(state, cfg, "gpt2")
    assert convert_hf_state_dict({**state, **buffers}, cfg, "gpt2").keys() == reference.keys()
    base = {k.removeprefix("transformer."): v for k, v in {**state, **buffers}.items() if k != "lm_head.weight"}
    converted = convert_hf_state_dict(base, cfg, "gpt2")
    assert converted.keys() == reference.keys()
    for k, v in reference.items():
        assert torch.equal(converted[k], v), k
    with pytest.raises(ValueError, match=r"(?s)no 'transformer\.' prefix.*missing keys \(1\): transformer\.h\.1\.ln_2\.bias"):
        convert_hf_state_dict({k: v for k, v in base.items() if k != "h.1.ln_2.bias"}, cfg, "gpt2")
    llama = _llama(tied=False)
    inv_freq = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": torch.zeros(8) for i in range(2)}
    ours = CausalLM(config_from_hf(llama.config.to_dict()))
    load_hf_into(ours, {**llama.state_dict(), **inv_freq}, "llama")
    assert torch.equal(ours.layers[1].self_attn.q_proj.weight,  # the rotary buffers were ignored, the rest loaded
                       llama.state_dict()["model.layers.1.self_attn.q_proj.weight"])
