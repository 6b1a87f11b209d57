"""The speedrun's model and training tricks: ReLU² in the lesson's FFN, zero-initialised output
projections (training/zero_init.py), each checked against what it promises."""

import pytest
import torch
import torch.nn.functional as F

from handformer.config import CausalLMConfig, Seq2SeqConfig
from handformer.models.causal_lm import CausalLM
from handformer.models.seq2seq import Seq2SeqTransformer
from handformer.nn.feed_forward import FeedForward
from handformer.training import loop
from handformer.training.loop import TrainConfig
from handformer.training.zero_init import zero_output_projections

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = dict(vocab_size=40, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32, n_layers=2, max_positions=16)


def test_relu2_is_relu_squared_in_the_plain_ffn():
    torch.manual_seed(0)
    ffn = FeedForward(8, 16, "relu2", bias=True)
    x = torch.randn(2, 3, 8)
    assert type(ffn) is FeedForward and ffn.activation == "relu2"
    want = ffn.down_proj(F.relu(ffn.up_proj(x)) ** 2)
    torch.testing.assert_close(ffn(x), want)
    model = CausalLM(CausalLMConfig.llama_style(**{**SMALL, "activation": "relu2"}))
    assert all(type(b.ffn) is FeedForward for b in model.layers)
    assert model(torch.randint(0, 40, (1, 5))).logits.shape == (1, 5, 40)


@pytest.mark.parametrize("build", [
    lambda: CausalLM(CausalLMConfig.llama_style(**SMALL)),
    lambda: CausalLM(CausalLMConfig.gpt2_style(**{**SMALL, "n_kv_heads": None})),
    lambda: Seq2SeqTransformer(Seq2SeqConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2,
                                             d_ff=32, n_encoder_layers=1, n_decoder_layers=1)),
], ids=["llama", "gpt2", "seq2seq"])
def test_zero_init_zeroes_the_projections_into_the_residual_stream_and_nothing_else(build):
    torch.manual_seed(0)
    model = build()
    before = {n: p.clone() for n, p in model.named_parameters()}
    zeroed = zero_output_projections(model)
    assert zeroed >= 2
    for name, p in model.named_parameters():
        if name.split(".")[-2] in ("o_proj", "down_proj"):
            assert not p.any(), name
        else:
            assert torch.equal(p, before[name]), name


def test_a_zero_init_block_starts_as_the_identity():
    torch.manual_seed(0)
    model = CausalLM(CausalLMConfig.llama_style(**SMALL))
    zero_output_projections(model)
    tokens = torch.randint(0, 40, (1, 5))
    hidden = model.embed(tokens)  # (1, 5, D)
    for layer in model.layers:
        out = layer(hidden)
        torch.testing.assert_close(out[0] if isinstance(out, tuple) else out, hidden)


class Stop(Exception):
    pass


def test_the_loop_zeroes_a_new_model_when_asked(tmp_path, monkeypatch):
    seen = {}

    def capture(model, *args, **kwargs):
        seen["o_proj"] = [layer.self_attn.o_proj.weight.detach().clone() for layer in model.layers]
        seen["down_proj"] = [layer.ffn.down_proj.weight.detach().clone() for layer in model.layers]
        raise Stop

    monkeypatch.setattr(loop, "train", capture)
    for zero in (True, False):
        with pytest.raises(Stop):
            loop.train_new_model(lambda: CausalLM(CausalLMConfig.llama_style(**SMALL)),
                                 TrainConfig(zero_init_projections=zero, progress=False), [], None,
                                 None, tmp_path, log=lambda _: None)
        weights = seen["o_proj"] + seen["down_proj"]
        assert all(not w.any() for w in weights) if zero else all(w.any() for w in weights)
