"""Invalid configs and bad model inputs fail early with a message that says what is wrong.

Config errors are ValueError naming the field (`ClassName.field=value is invalid: fix`); input errors
are ValueError/TypeError with a message, never an IndexError from deep inside torch.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from handformer.config import (
    FAMILY_FIELDS,
    BlockConfig,
    CausalLMConfig,
    FamilyConfig,
    Seq2SeqConfig,
    config_from_dict,
    load_config,
)
from handformer.models.causal_lm import CausalLM
from handformer.models.seq2seq import Seq2SeqTransformer

SMALL = dict(d_model=16, n_heads=4, d_ff=32, max_positions=16)


# --- invalid configs ----------------------------------------------------------------------------

BLOCK_ERRORS = [
    (dict(d_model=30, n_heads=4), "d_model"),
    (dict(d_model=0), "d_model"),
    (dict(d_model=-16), "d_model"),
    (dict(d_model=16.0), "d_model"),
    (dict(d_model="16"), "d_model"),
    (dict(d_model=True), "d_model"),
    (dict(n_heads=0), "n_heads"),
    (dict(n_heads=4, n_kv_heads=3), "n_kv_heads"),
    (dict(n_kv_heads=0), "n_kv_heads"),
    (dict(n_kv_heads=-2), "n_kv_heads"),
    (dict(n_kv_heads=2.0), "n_kv_heads"),
    (dict(n_kv_heads=True), "n_kv_heads"),
    (dict(d_ff=0), "d_ff"),
    (dict(max_positions=0), "max_positions"),
    (dict(activation="swish"), "activation"),
    (dict(activation="ReLU"), "activation"),
    (dict(norm="batchnorm"), "norm"),
    (dict(norm_placement="middle"), "norm_placement"),
    (dict(position="alibi"), "position"),
    (dict(dropout=-0.1), "dropout"),
    (dict(dropout=1.0), "dropout"),
    (dict(dropout="0.1"), "dropout"),
    (dict(attention_dropout=-0.5), "attention_dropout"),
    (dict(attention_dropout=1.5), "attention_dropout"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(norm_eps=-1e-5), "norm_eps"),
    (dict(norm_eps="1e-5"), "norm_eps"),
    (dict(position="rope", rope_theta=0.0), "rope_theta"),
    (dict(position="rope", rope_theta="10000"), "rope_theta"),
    (dict(position="rope", d_model=12, n_heads=4), "d_model"),  # head dim 3 is odd
    (dict(position="sinusoidal", d_model=9, n_heads=3), "d_model"),
]


def _field_in(message: str, cls: type, field: str) -> bool:
    return f"{cls.__name__}.{field}=" in message


@pytest.mark.parametrize("cls", [BlockConfig, Seq2SeqConfig, CausalLMConfig])
@pytest.mark.parametrize(("bad", "field"), BLOCK_ERRORS, ids=[f"{f}:{b}" for b, f in BLOCK_ERRORS])
def test_invalid_block_settings_name_the_field(cls, bad, field):
    kwargs = {**SMALL, "position": "learned", **bad}
    with pytest.raises(ValueError) as err:
        cls(**kwargs)
    assert _field_in(str(err.value), cls, field), str(err.value)
    assert "is invalid" in str(err.value)


@pytest.mark.parametrize(("bad", "field"), [
    (dict(src_vocab_size=0), "src_vocab_size"),
    (dict(tgt_vocab_size=-1), "tgt_vocab_size"),
    (dict(n_encoder_layers=0), "n_encoder_layers"),
    (dict(n_decoder_layers=0), "n_decoder_layers"),
    (dict(n_decoder_layers=1.5), "n_decoder_layers"),
    (dict(share_embeddings=True, src_vocab_size=10, tgt_vocab_size=12), "share_embeddings"),
    (dict(pad_id=-1), "pad_id"),
    (dict(pad_id=10, src_vocab_size=10, tgt_vocab_size=20), "pad_id"),
])
def test_invalid_seq2seq_settings_name_the_field(bad, field):
    with pytest.raises(ValueError) as err:
        Seq2SeqConfig(**{**SMALL, **bad})
    assert _field_in(str(err.value), Seq2SeqConfig, field), str(err.value)


@pytest.mark.parametrize(("bad", "field"), [
    (dict(vocab_size=0), "vocab_size"),
    (dict(n_layers=0), "n_layers"),
    (dict(n_layers=True), "n_layers"),
])
def test_invalid_causal_lm_settings_name_the_field(bad, field):
    with pytest.raises(ValueError) as err:
        CausalLMConfig(**{**SMALL, **bad})
    assert _field_in(str(err.value), CausalLMConfig, field), str(err.value)


def test_config_errors_say_how_to_fix():
    with pytest.raises(ValueError, match=r"divisible by n_heads=4"):
        BlockConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match=r"choose one of relu, relu2, gelu, gelu_tanh, swiglu, geglu"):
        BlockConfig(activation="swish")
    with pytest.raises(ValueError, match=r"probability in \[0, 1\)"):
        BlockConfig(dropout=-0.1)


def test_presets_validate_their_overrides():
    with pytest.raises(ValueError, match=r"CausalLMConfig\.n_kv_heads="):
        CausalLMConfig.llama_style(n_heads=8, n_kv_heads=3)
    with pytest.raises(ValueError, match=r"CausalLMConfig\.activation="):
        CausalLMConfig.gpt2_style(activation="tanh")
    llama = CausalLMConfig.llama_style(**SMALL, n_kv_heads=2)
    assert (llama.position, llama.norm, llama.activation, llama.bias) == ("rope", "rmsnorm", "swiglu", False)
    assert llama.kv_heads == 2 and llama.head_dim == 4


def test_seq2seq_config_refuses_rope_naming_the_field():
    with pytest.raises(ValueError, match=r"Seq2SeqConfig.position='rope' is invalid"):
        Seq2SeqConfig(**SMALL, position="rope", src_vocab_size=10, tgt_vocab_size=10)


def test_assigning_an_invalid_value_is_caught_by_validate():
    cfg = BlockConfig(**SMALL)
    cfg.d_model = -8
    with pytest.raises(ValueError, match=r"BlockConfig\.d_model="):
        cfg.validate()


# --- JSON round trip -------------------------------------------------------------------------------

ROUND_TRIP_CONFIGS = [
    Seq2SeqConfig(),
    Seq2SeqConfig(**SMALL, src_vocab_size=50, tgt_vocab_size=50, share_embeddings=True, pad_id=3,
                  norm_placement="pre", norm="rmsnorm", position="none", dropout=0.0),
    CausalLMConfig(),
    CausalLMConfig.gpt2_style(**SMALL, vocab_size=99),
    CausalLMConfig.llama_style(**SMALL, n_kv_heads=2, vocab_size=99, rope_theta=500000.0),
]


@pytest.mark.parametrize("cfg", ROUND_TRIP_CONFIGS, ids=lambda c: type(c).__name__)
def test_config_json_round_trip(cfg, tmp_path):
    path = tmp_path / "model.json"
    cfg.save(path)
    data = json.loads(path.read_text())
    assert data["kind"] == cfg.kind
    loaded = load_config(path)
    assert type(loaded) is type(cfg)
    assert loaded == cfg
    assert loaded.to_dict() == cfg.to_dict()
    assert config_from_dict(cfg.to_dict()) == cfg


def test_load_config_reads_the_model_section_of_a_run_config(tmp_path):
    cfg = CausalLMConfig.gpt2_style(**SMALL, vocab_size=99)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model": cfg.to_dict(), "training": {"lr": 3e-4}}))
    assert load_config(path) == cfg


def test_unknown_field_is_an_error_naming_it(tmp_path):
    data = {**Seq2SeqConfig(**SMALL).to_dict(), "n_layer": 6}
    with pytest.raises(ValueError, match=r"unknown field\(s\) n_layer"):
        Seq2SeqConfig.from_dict(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="n_layer"):
        load_config(path)


def test_invalid_value_in_json_names_the_field(tmp_path):
    data = {**CausalLMConfig(**SMALL).to_dict(), "norm": "batchnorm"}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"CausalLMConfig\.norm='batchnorm'"):
        load_config(path)


def test_family_mismatch_and_missing_family_are_errors(tmp_path):
    with pytest.raises(ValueError, match="kind 'seq2seq'"):
        CausalLMConfig.from_dict(Seq2SeqConfig(**SMALL).to_dict())
    with pytest.raises(ValueError, match="kind"):
        config_from_dict({"d_model": 16})
    with pytest.raises(ValueError, match="kind"):
        config_from_dict({"kind": "vision", "d_model": 16})
    with pytest.raises(ValueError, match="kind 'seq2seq'"):  # the name older files give it
        CausalLMConfig.from_dict({"family": "seq2seq", "d_model": 16})


GEMMA2_SETTINGS = dict(attn_scale_dim=12.0, attn_softcap=50.0, logit_softcap=30.0)


def _gemma2_like(**family):
    return CausalLMConfig.llama_style(**SMALL, n_kv_heads=2, vocab_size=99, n_layers=2, norm_placement="sandwich",
                                      sliding_window=4, global_layers=[1], **family)


def test_family_settings_live_in_the_family_section_and_flat_saved_configs_load_the_same():
    cfg = _gemma2_like(**GEMMA2_SETTINGS)  # keywords spelled flat land in the section
    assert cfg.family == FamilyConfig(**GEMMA2_SETTINGS) and cfg.attn_softcap == 50.0
    saved = cfg.to_dict()
    assert saved["kind"] == "causal_lm" and saved["family"] == GEMMA2_SETTINGS
    assert not set(FAMILY_FIELDS) & set(saved)  # written nested, never flat
    assert "family" not in CausalLMConfig.llama_style(**SMALL).to_dict()  # a model of none saves none
    flat = {k: v for k, v in saved.items() if k not in ("kind", "family")}
    old = {"family": "causal_lm", **flat, **GEMMA2_SETTINGS, "rope_local_theta": None, "nope_layers": []}
    assert config_from_dict(old) == cfg and config_from_dict(old).to_dict() == saved
    assert replace(cfg, logit_softcap=20.0).family.logit_softcap == 20.0  # replace takes the flat keywords
    assert replace(cfg, logit_softcap=None).family == FamilyConfig(attn_scale_dim=12.0, attn_softcap=50.0)
    with pytest.raises(ValueError, match="attn_softcap is set both flat and in the family section"):
        CausalLMConfig.from_dict({**saved, "attn_softcap": 20.0})
    with pytest.raises(ValueError, match=r"\[model\.family\] attn_softcap='high' is invalid: it must be a"):
        CausalLMConfig.from_dict({**saved, "family": {"attn_softcap": "high"}}, "model")


@pytest.mark.parametrize("family, message", [
    (dict(attn_softcap=-1.0), r"CausalLMConfig\.family\.attn_softcap=-1\.0 is invalid: it must be a number > 0"),
    (dict(nope_layers=[2]), r"CausalLMConfig\.family\.nope_layers=\[2\] is invalid: it must be a list of distinct"),
    (dict(rope_local_theta=1e4), r"CausalLMConfig\.family\.rope_local_theta=10000\.0 is invalid"),
])
def test_family_setting_errors_name_the_field_in_its_section(family, message):
    with pytest.raises(ValueError, match=message):
        CausalLMConfig.llama_style(**SMALL, n_layers=2, **family)


def test_load_config_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config file"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_config(bad)


# --- bad model inputs ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lm() -> CausalLM:
    return CausalLM(CausalLMConfig.gpt2_style(**SMALL, vocab_size=20, n_layers=1)).eval()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def any_lm(request) -> CausalLM:
    preset = getattr(CausalLMConfig, f"{request.param}_style")
    kv = {"n_kv_heads": 2} if request.param == "llama" else {}
    return CausalLM(preset(**SMALL, **kv, vocab_size=20, n_layers=1)).eval()


@pytest.fixture(scope="module")
def s2s() -> Seq2SeqTransformer:
    cfg = Seq2SeqConfig(**SMALL, src_vocab_size=20, tgt_vocab_size=30, n_encoder_layers=1,
                        n_decoder_layers=1)
    return Seq2SeqTransformer(cfg).eval()


GOOD = torch.tensor([[1, 2, 3]])

LM_BAD_IDS = [
    (torch.tensor([[1, 20, 3]]), ValueError, r"token id 20, outside the vocabulary \[0, 20\)"),
    (torch.tensor([[1, 999, 3]]), ValueError, "outside the vocabulary"),
    (torch.tensor([[1, -1, 3]]), ValueError, "token id -1"),
    (torch.tensor([[1.0, 2.0, 3.0]]), TypeError, "integer token ids"),
    (torch.tensor([[True, False]]), TypeError, "integer token ids"),
    (torch.tensor([1, 2, 3]), ValueError, r"shape \(batch, length\).*ids\[None\]"),
    (torch.tensor([[[1, 2, 3]]]), ValueError, r"shape \(batch, length\)"),
    (torch.zeros(1, 0, dtype=torch.long), ValueError, "empty"),
    (torch.zeros(0, 3, dtype=torch.long), ValueError, "empty"),
    ([[1, 2, 3]], TypeError, "torch.Tensor"),
    (torch.ones(1, 17, dtype=torch.long), ValueError, "max_positions=16"),
]


@pytest.mark.parametrize(("x", "exc", "message"), LM_BAD_IDS,
                         ids=[m.split(" ")[0] + str(i) for i, (_, _, m) in enumerate(LM_BAD_IDS)])
@torch.no_grad()
def test_causal_lm_bad_input_ids(any_lm, x, exc, message):
    with pytest.raises(exc, match=message):
        any_lm(x)


@torch.no_grad()
def test_causal_lm_accepts_the_edges(any_lm):
    assert any_lm(torch.tensor([[0, 19]])).logits.shape == (1, 2, 20)
    assert any_lm(torch.ones(1, 16, dtype=torch.long)).logits.shape == (1, 16, 20)
    assert any_lm(torch.tensor([[0, 19]], dtype=torch.int32)).logits.shape == (1, 2, 20)


@pytest.mark.parametrize(("mask", "exc", "message"), [
    (torch.ones(1, 4, dtype=torch.long), ValueError, r"attention_mask must have shape \(1, 3\)"),
    (torch.ones(2, 3, dtype=torch.long), ValueError, r"attention_mask must have shape \(1, 3\)"),
    (torch.ones(3, dtype=torch.long), ValueError, r"attention_mask must have shape \(1, 3\)"),
    (torch.ones(1, 1, 3, dtype=torch.long), ValueError, r"attention_mask must have shape"),
    (torch.ones(1, 3), TypeError, "attention_mask must be bool or integer"),
    ([[1, 1, 1]], TypeError, "attention_mask must be a torch.Tensor"),
])
@torch.no_grad()
def test_causal_lm_bad_attention_mask(any_lm, mask, exc, message):
    with pytest.raises(exc, match=message):
        any_lm(GOOD, attention_mask=mask)


@torch.no_grad()
def test_causal_lm_attention_mask_covers_cached_positions(lm):
    cache = lm.new_cache(8)
    lm(GOOD, cache=cache)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(1, 4\)"):
        lm(torch.tensor([[4]]), attention_mask=torch.ones(1, 1, dtype=torch.long), cache=cache)
    out = lm(torch.tensor([[4]]), attention_mask=torch.ones(1, 4, dtype=torch.long), cache=cache)
    assert out.logits.shape == (1, 1, 20)


@torch.no_grad()
def test_causal_lm_bad_position_ids(any_lm):
    lm = any_lm
    with pytest.raises(ValueError, match=r"position_ids must have shape \(1, 3\)"):
        lm(GOOD, position_ids=torch.arange(4)[None])
    with pytest.raises(ValueError, match="max_positions=16"):
        lm(GOOD, position_ids=torch.tensor([[14, 15, 16]]))
    with pytest.raises(ValueError, match="position_ids must be >= 0, got -1"):
        lm(GOOD, position_ids=torch.tensor([[-1, 0, 1]]))
    with pytest.raises(TypeError, match="position_ids must hold integer positions"):
        lm(GOOD, position_ids=torch.tensor([[0.0, 1.0, 2.0]]))


@torch.no_grad()
def test_causal_lm_decoding_past_max_positions_or_cache_is_refused(lm):
    cache = lm.new_cache()
    lm(torch.ones(1, 15, dtype=torch.long), cache=cache)
    lm(torch.ones(1, 1, dtype=torch.long), cache=cache)  # position 15: the last one
    with pytest.raises(ValueError, match="max_positions=16"):
        lm(torch.ones(1, 1, dtype=torch.long), cache=cache)
    small = lm.new_cache(4)
    lm(GOOD, cache=small)
    with pytest.raises(ValueError, match="KV cache is full"):
        lm(torch.ones(1, 2, dtype=torch.long), cache=small)


@pytest.mark.parametrize(("src", "tgt", "exc", "message"), [
    (torch.tensor([[1, 20]]), GOOD, ValueError, r"src_ids contains token id 20.*\[0, 20\)"),
    (torch.tensor([[1, -3]]), GOOD, ValueError, "src_ids contains token id -3"),
    (GOOD, torch.tensor([[1, 30]]), ValueError, r"tgt_ids contains token id 30.*\[0, 30\)"),
    (GOOD, torch.tensor([[25, 29]]).float(), TypeError, "tgt_ids must hold integer token ids"),
    (torch.tensor([1, 2]), GOOD, ValueError, r"src_ids must have shape \(batch, length\)"),
    (GOOD, torch.tensor([1, 2]), ValueError, r"tgt_ids must have shape \(batch, length\)"),
    (torch.ones(1, 17, dtype=torch.long), GOOD, ValueError, "max_positions=16"),
    (GOOD, torch.ones(1, 17, dtype=torch.long), ValueError, "max_positions=16"),
])
@torch.no_grad()
def test_seq2seq_bad_inputs(s2s, src, tgt, exc, message):
    with pytest.raises(exc, match=message):
        s2s(src, tgt)


@torch.no_grad()
def test_seq2seq_cached_decoding_past_max_positions_is_refused(s2s):
    memory, src_mask, _ = s2s.encode(GOOD)
    cache = s2s.new_cache(32)
    s2s.decode(torch.ones(1, 16, dtype=torch.long), memory, src_mask, cache=cache)
    with pytest.raises(ValueError, match="max_positions=16"):
        s2s.decode(torch.ones(1, 1, dtype=torch.long), memory, src_mask, cache=cache)
