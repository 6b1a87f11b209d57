"""Linear layers packed for oneDNN (handformer/inference/packed_linear.py) and where they are applied.

A packed layer must compute `F.linear` (up to the order of sums), give its plain weight back bit for
bit (state dict, `to_linear`, `unpack_linears`), load a state dict into its packed form, refuse
training, and leave a model's greedy tokens unchanged. The CLI packs after loading; tiny models
(weights under 1 MiB) stay as they are.
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import make_translation_run, missing
from torch import nn

from handformer.cli import main
from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.generation.generate import generate
from handformer.inference.packed_linear import (
    PackedLinear,
    pack_linears,
    packing_available,
    packs_dtype,
    unpack_linears,
)
from handformer.inference.prepare import PLAIN_ENV, prepare_for_decoding
from handformer.inference.quant import Int8Linear, quantize_linears
from handformer.inference.threads import default_threads
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.run import load_lm, save_lm_run
from handformer.tasks.translation.translator import Translator

pytestmark = pytest.mark.usefixtures("one_thread")
NO_PACKING = "this torch has no oneDNN linear packing (torch.ops.mkldnn; an x86 build of torch has it)"
if not packing_available():
    missing(NO_PACKING)  # fails under HANDFORMER_REQUIRE_REFERENCES=1, as the other references do


def _linear(n_out=300, n_in=100, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(n_in, n_out, bias=bias).eval()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_hint", [None, 1])
def test_packed_layer_computes_f_linear(bias, batch_hint):
    linear = _linear(bias=bias)
    packed = PackedLinear.from_linear(linear, batch_hint).eval()
    x = torch.randn(2, 7, 100)
    for inputs in (x, x[:, 0], x.transpose(0, 1), x[0, :1]):  # 3-D, 2-D, non-contiguous, one row
        torch.testing.assert_close(packed(inputs), F.linear(inputs, linear.weight, linear.bias),
                                   rtol=1e-5, atol=1e-5)
    y = packed(x.bfloat16())
    assert y.dtype == torch.bfloat16 and y.shape == (2, 7, 300)


def test_plain_weight_comes_back_bit_for_bit():
    linear = _linear()
    packed = PackedLinear.from_linear(linear)
    assert torch.equal(packed.weight, linear.weight)
    state = packed.state_dict()
    assert set(state) == {"weight", "bias"} and torch.equal(state["weight"], linear.weight)
    back = packed.to_linear()
    assert type(back) is nn.Linear
    assert torch.equal(back.weight, linear.weight) and torch.equal(back.bias, linear.bias)


def test_loading_a_state_dict_repacks_it():
    packed = PackedLinear.from_linear(_linear(seed=0)).eval()
    other = _linear(seed=1)
    packed.load_state_dict(other.state_dict())
    x = torch.randn(3, 100)
    torch.testing.assert_close(packed(x), other(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="size mismatch for weight"):
        packed.load_state_dict(_linear(n_out=30).state_dict())
    with pytest.raises(RuntimeError, match="Missing key.*weight"):
        packed.load_state_dict({"bias": other.bias})


def test_training_a_packed_layer_is_refused_with_the_fix():
    packed = PackedLinear.from_linear(_linear())
    packed.train()
    with pytest.raises(RuntimeError, match="packed for inference.*unpack_linears"):
        packed(torch.randn(1, 100))


def test_bf16_weights_pack_where_the_cpu_can_and_other_dtypes_are_refused():
    with pytest.raises(ValueError, match="fp32 or bf16 CPU weights"):
        PackedLinear(torch.zeros(4, 4, dtype=torch.float16), None)
    linear = _linear().to(torch.bfloat16)
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():  # an AVX2-only CPU: a clear error, no traceback
        with pytest.raises(ValueError, match="cannot pack torch.bfloat16 weights.*nn.Linear"):
            PackedLinear.from_linear(linear)
        assert not packs_dtype(torch.bfloat16) and pack_linears(nn.Sequential(linear), min_bytes=0) == []
        return
    packed = PackedLinear.from_linear(linear)
    x = torch.randn(3, 100, dtype=torch.bfloat16)
    expected = F.linear(x.float(), linear.weight.float(), linear.bias.float())
    torch.testing.assert_close(packed(x).float(), expected, rtol=2e-2, atol=2e-2)  # bf16 outputs
    assert packed(x).dtype == torch.bfloat16 and packed(x.float()).dtype == torch.float32
    assert torch.equal(packed.weight, linear.weight) and packed.to_linear().weight.dtype == torch.bfloat16
    assert packs_dtype(torch.bfloat16)


def _model(tied=True, preset="gpt2", vocab=300):
    torch.manual_seed(0)
    style = CausalLMConfig.gpt2_style if preset == "gpt2" else CausalLMConfig.llama_style
    extra = {} if preset == "gpt2" else {"n_kv_heads": 2}
    cfg = style(vocab_size=vocab, d_model=64, n_heads=4, d_ff=256, n_layers=2, max_positions=64,
                tie_embeddings=tied, **extra)
    return CausalLM(cfg).eval()


@pytest.mark.parametrize("preset,tied", [("gpt2", True), ("llama", False)])
def test_a_packed_model_decodes_the_same_tokens(preset, tied):
    model = _model(tied, preset)
    prompts = [[5, 7, 9, 11], [3, 4]]
    x = torch.tensor([[5, 7, 9, 11, 2, 8]])
    before_logits = model(x).logits
    before_state = {k: v.clone() for k, v in model.state_dict().items()}
    before = generate(model, prompts, 12, temperature=0)
    names = pack_linears(model, min_bytes=0)
    assert len(names) == 2 * (4 + (3 if preset == "llama" else 2)) + 1  # every projection and the head
    assert isinstance(model.lm_head, PackedLinear)
    assert isinstance(model.embed.weight, nn.Parameter)  # the lookup keeps its table, tied or not
    torch.testing.assert_close(model(x).logits, before_logits, rtol=1e-5, atol=1e-5)
    assert generate(model, prompts, 12, temperature=0) == before
    state = model.state_dict()  # what export-hf and save_weights read: the same names and values
    assert state.keys() == before_state.keys()
    assert all(torch.equal(state[k], before_state[k]) for k in state)
    assert unpack_linears(model) == names
    assert all(type(m) is not PackedLinear for m in model.modules())
    assert torch.equal(model(x).logits, before_logits)


def test_small_weights_int8_layers_and_skipped_names_stay_as_they_are():
    model = _model()
    assert pack_linears(model) == []  # every matrix here is under 1 MiB
    assert pack_linears(model, min_bytes=0, skip=["lm_head", "layers.0.ffn.up_proj"]) == [
        f"layers.{i}.{name}" for i in (0, 1)
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                     "ffn.up_proj", "ffn.down_proj") if (i, name) != (0, "ffn.up_proj")]
    assert type(model.layers[0].ffn.up_proj) is nn.Linear
    unpack_linears(model)
    quantize_linears(model, skip=["lm_head"])  # int8 layers are not nn.Linear: only the head is left
    assert pack_linears(model, min_bytes=0) == ["lm_head"]
    assert isinstance(model.layers[0].ffn.up_proj, Int8Linear)


def test_threads_follow_the_packed_weights_size():
    model = _model(tied=False, vocab=300)
    assert default_threads(model) == 1
    big = nn.Linear(1024, 1024).eval()
    model.lm_head = PackedLinear.from_linear(big)  # a 4 MiB matrix, packed: not small any more
    assert default_threads(model) is None


TEXT = "the quick brown fox jumps over the lazy dog. " * 20


def _run(tmp_path, d_model=256, d_ff=1024):
    tok = Tokenizer.train_char([TEXT])
    torch.manual_seed(0)
    cfg = CausalLMConfig.llama_style(vocab_size=tok.vocab_size, d_model=d_model, n_heads=4,
                                     d_ff=d_ff, n_layers=1, max_positions=64)
    save_lm_run(tmp_path / "run", CausalLM(cfg).eval(), tok, SpecialTokens())
    return tmp_path / "run"


def test_generate_command_fuses_and_packs_and_prints_the_same_text(tmp_path, capsys, monkeypatch):
    run_dir = _run(tmp_path)  # d_ff 1024 x d_model 256: the FFN's matrices are exactly 1 MiB
    run = load_lm(run_dir)
    prepare_for_decoding(run.model)
    packed = [n for n, m in run.model.named_modules() if isinstance(m, PackedLinear)]
    # fused first (inference/fuse.py): gate and up are one 2 MiB matrix, packed with the 1 MiB down_proj
    assert packed == ["layers.0.ffn.gate_up_proj", "layers.0.ffn.down_proj"]
    args = ["generate", str(run_dir), "--prompt", "the quick", "--max-new-tokens", "20", "--temperature", "0"]
    assert main(args) == 0
    fast = capsys.readouterr().out
    monkeypatch.setenv(PLAIN_ENV, "1")
    assert main(args) == 0
    assert capsys.readouterr().out == fast
    plain = load_lm(run_dir)
    prepare_for_decoding(plain.model)
    assert not any(isinstance(m, PackedLinear) for m in plain.model.modules())


def test_a_packed_translation_model_translates_the_same(tmp_path):
    translator = Translator.load(make_translation_run(tmp_path / "run", max_len_b=12))
    texts = ["the first of may", "twenty twenty"]
    before = {beam: translator.translate(texts, beam=beam) for beam in (1, 3)}
    names = pack_linears(translator.model, min_bytes=0)
    assert "encoder.layers.0.self_attn.q_proj" in names and "decoder.layers.1.cross_attn.v_proj" in names
    assert {beam: translator.translate(texts, beam=beam) for beam in (1, 3)} == before


def test_a_dtype_onednn_cannot_run_is_left_plain(monkeypatch):
    import handformer.inference.packed_linear as packed_linear

    model = _model()
    monkeypatch.setattr(packed_linear, "_WORKS", {torch.float32: False})
    assert pack_linears(model, min_bytes=0) == []
    monkeypatch.setattr(packed_linear, "_WORKS", {})
    assert packed_linear.packs_dtype(torch.float32)
    assert pack_linears(model, min_bytes=0) != []
