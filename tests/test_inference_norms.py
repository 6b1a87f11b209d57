"""The decoding twins of the norms (handformer.inference.norms) and the lesson's NoDropout: the same
numbers as the modules they stand for, plain calls, swapped in by prepare_for_decoding."""

import pytest
import torch
from torch import nn

from handformer.config import CausalLMConfig
from handformer.inference.norms import DecodingLayerNorm, DecodingOffsetRMSNorm, DecodingRMSNorm, plain_norms
from handformer.inference.prepare import prepare_for_decoding
from handformer.models.causal_lm import CausalLM
from handformer.nn.dropout import NoDropout, make_dropout
from handformer.nn.norms import LayerNorm, OffsetRMSNorm, RMSNorm

TINY = dict(vocab_size=97, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, max_positions=64)


def trained_like(norm: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p))
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lesson", [lambda: RMSNorm(16), lambda: LayerNorm(16), lambda: LayerNorm(16, bias=False),
                                    lambda: OffsetRMSNorm(16)])
def test_a_decoding_norm_computes_what_its_lesson_norm_does(lesson, dtype):
    torch.manual_seed(0)
    norm = trained_like(lesson()).to(dtype)
    twin = plain_norms(nn.Sequential(norm))[0]
    assert type(twin) in (DecodingRMSNorm, DecodingLayerNorm, DecodingOffsetRMSNorm)
    assert twin.weight is norm.weight  # the same parameters, not copies
    for x in (torch.randn(2, 3, 16, dtype=dtype), torch.randn(2, 3, 16)):
        expected = norm(x)
        got = twin(x)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_float32_input_is_not_cast(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.Tensor, "type_as", lambda self, other: calls.append(1) or self)
    DecodingRMSNorm(RMSNorm(8))(torch.randn(2, 8))
    DecodingLayerNorm(LayerNorm(8))(torch.randn(2, 8))
    DecodingOffsetRMSNorm(OffsetRMSNorm(8))(torch.randn(2, 8))
    assert calls == []
    RMSNorm(8)(torch.randn(2, 8))  # the lesson's norm casts back always
    assert calls == [1]


def test_a_decoding_norm_is_a_plain_call():
    twin = DecodingRMSNorm(RMSNorm(8))
    seen = []
    twin.register_forward_hook(lambda *_: seen.append(1))
    twin(torch.randn(2, 8))
    assert seen == []  # documented: inference only, hooks do not run


def test_prepare_for_decoding_swaps_the_norms_and_keeps_the_tokens():
    torch.manual_seed(0)
    model = CausalLM(CausalLMConfig.llama_style(**TINY)).eval()
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
        prepare_for_decoding(model)
        got = model(ids).logits
    kinds = {type(m) for m in model.modules()}
    assert DecodingRMSNorm in kinds and RMSNorm not in kinds
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_other_norms_are_left_as_they_are():
    model = nn.Sequential(nn.LayerNorm(8), nn.RMSNorm(8))  # torch's own: not the lesson's
    plain_norms(model)
    assert [type(m) for m in model] == [nn.LayerNorm, nn.RMSNorm]


def test_a_model_without_dropout_has_no_dropout_modules_and_one_with_it_drops():
    assert isinstance(make_dropout(0.0), NoDropout) and isinstance(make_dropout(0.1), nn.Dropout)
    without = CausalLM(CausalLMConfig.llama_style(**TINY))
    assert not any(isinstance(m, nn.Dropout) for m in without.modules())
    assert sum(isinstance(m, NoDropout) for m in without.modules()) == 1 + TINY["n_layers"]  # the embeddings', one a block
    x = torch.randn(4, 8)
    assert make_dropout(0.0)(x) is x
    torch.manual_seed(0)
    with_dropout = CausalLM(CausalLMConfig.llama_style(**TINY, dropout=0.5)).train()
    ids = torch.randint(0, 97, (1, 9))
    assert not torch.equal(with_dropout(ids).logits, with_dropout(ids).logits)  # dropped, differently each time
    with_dropout.eval()
    assert torch.equal(with_dropout(ids).logits, with_dropout(ids).logits)
