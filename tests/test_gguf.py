"""GGUF both ways: `handformer export-gguf` and `handformer import-gguf`, checked by the `gguf` package
(llama.cpp's own Python library) and by transformers' GGUF loader.

- handformer's Q8_0 and Q4_0 blocks are the same bytes as `gguf.quants.quantize`; its decoding of F16,
  BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K the same float32 bits as `gguf.quants.dequantize`; Q4_0 read
  kept 4-bit (Int4Linear's values and scales) stands for the same float32 bits.
- a q4_0 export imported with --int4 is an int4 run (Llama's reordered q/k rows, GPT-2's split
  q/k/v and tied head) whose logits are the float import's, bit for bit.
- import(export(run)) at f32 is the run again for every architecture (random weights, norm gains
  and biases randomized so a swapped tensor shows): the same tensors bit for bit (Gemma: the same
  gains 1 + w), settings, tokenizer and special tokens, and the same logits bit for bit.
- transformers loads the exports of the architectures its GGUF loader reads (Llama, Mistral as
  Llama, Qwen2, Phi-3, GPT-2) and gives handformer's logits: f32 within 1e-5; f16 within 1e-2 and
  q8_0 within 5e-2 for trained models (the measured values are printed).
- a tokenizer rebuilt from the vocabulary keys alone (a file from llama.cpp's converter carries no
  tokenizer.json) encodes as the run's: characters (with some beyond ASCII), byte-level BPE,
  llama2.c's SentencePiece.
- LoRA runs export merged, quantized runs from their weights, chat templates and stop ids travel;
  files with K-quant tensors import decoded; every refusal is one line and exit code 2.
llama.cpp itself runs the exports in tests/test_gguf_llamacpp.py (slow: it needs llama-cpp-python).
"""

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import dataset_file, require_module
from safetensors.torch import load_file

from handformer.data.lookup import find_folder

gguf = require_module("gguf", "pip install -e '.[dev]'")
transformers = require_module("transformers", "pip install -e '.[dev]'")

from handformer.cli import main  # noqa: E402
from handformer.config import (  # noqa: E402
    CausalLMConfig,
    FamilyConfig,
    LinearRopeScaling,
    Llama3RopeScaling,
    LongRopeScaling,
    MoEConfig,
    YarnRopeScaling,
)
from handformer.convert.gguf_arch import FAMILIES, LONGROPE_KEYS, rope_factors  # noqa: E402
from handformer.convert.gguf_file import read_gguf  # noqa: E402
from handformer.convert.gguf_quants import BLOCKS, dequantize, q4_0_to_int4, quantize_q4_0, quantize_q8_0  # noqa: E402
from handformer.convert.gguf_tokenizer import tokenizer_from_gguf  # noqa: E402
from handformer.data.special_tokens import SpecialTokens  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402
from handformer.families import build_causal_lm  # noqa: E402
from handformer.tasks.lm.imports import import_hf  # noqa: E402
from handformer.tasks.lm.run import load_lm, save_lm_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
STORIES = find_folder("stories260K")  # through the data lookup; None when it is not on this machine
TEXT = "to be or not to be, that is the question: whether 'tis nobler in the mind to suffer\n"
QT = gguf.GGMLQuantizationType


# --- GGML's block formats ----------------------------------------------------------------------------

def test_q8_0_blocks_are_the_bytes_gguf_writes():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 4, 96, generator=g) * 3
    w[0, 0, :32] = 0  # an all-zero block: scale 0
    w[0, 1, :32] = (torch.arange(32) - 15.5) / 31 * 127  # exact halves after scaling
    w[0, 2, :32] = torch.tensor([1e-30, -6e4, 0.5] * 10 + [2.5, -2.5])  # tiny, huge, ties
    ours = quantize_q8_0(w).numpy()
    assert ours.dtype == np.uint8 and ours.shape == (8, 4, 96 // 32 * 34)
    assert np.array_equal(ours, gguf.quants.quantize(w.numpy(), QT.Q8_0))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(torch.zeros(2, 48))


def test_q4_0_blocks_are_the_bytes_gguf_writes():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 4, 96, generator=g) * 3
    w[0, 0, :32] = 0  # an all-zero block: scale 0
    w[0, 1, :32] = torch.tensor([1.0, -1.0] * 16)  # the peak's sign decides: the first one wins
    w[0, 2, :32] = (torch.arange(32) - 16) / 8 * 5  # values that land on q + 0.5 before truncation
    ours = quantize_q4_0(w).numpy()
    assert ours.dtype == np.uint8 and ours.shape == (8, 4, 96 // 32 * 18)
    assert np.array_equal(ours, gguf.quants.quantize(w.numpy(), QT.Q4_0))
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q4_0(torch.zeros(2, 48))


def test_q4_0_kept_4_bit_is_the_float_gguf_decodes():
    """gguf's own Q4_0 bytes, read as Int4Linear's values and scales (zeros 0): its dequantization,
    and the layer's output on the exact kernel, are gguf's float32 weight's."""
    from handformer.inference.quant_int4 import Int4Linear, dequantize_int4, pack_nibbles

    w = torch.randn(24, 96, generator=torch.Generator().manual_seed(2))
    raw = gguf.quants.quantize(w.numpy(), QT.Q4_0)
    expected = torch.from_numpy(gguf.quants.dequantize(raw, QT.Q4_0))
    values, scales = q4_0_to_int4(torch.from_numpy(raw), (24, 96))
    assert values.shape == (24, 96) and scales.shape == (24, 3) and int(values.max()) <= 15
    assert torch.equal(dequantize_int4(values, scales, torch.zeros_like(scales)), expected)
    layer = Int4Linear(96, 24, bias=False, kernel="dequant")
    layer.weight.copy_(pack_nibbles(values))
    layer.scales.copy_(scales)
    x = torch.randn(3, 96)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, expected))
    with pytest.raises(ValueError, match="needs"):
        q4_0_to_int4(torch.from_numpy(raw[:, 1:]), (24, 96))


@pytest.mark.parametrize("preset", ["llama_gqa", "gpt2"])
def test_a_q4_0_export_imports_kept_4_bit(preset, tmp_path):
    from handformer.inference.quant_int4 import Int4Linear
    from handformer.tasks.lm.imports import import_gguf

    tok = Tokenizer.train_char([TEXT])
    run_dir = _run(tmp_path / "run", PRESETS[preset][0](tok.vocab_size), tok)
    out = tmp_path / "model.gguf"
    assert main(["export-gguf", str(run_dir), str(out), "--type", "q4_0"]) == 0
    types = {t.type_name for t in read_gguf(out).tensors.values()}
    assert types == {"F32", "Q4_0"}
    import_gguf(out, tmp_path / "float")
    import_gguf(out, tmp_path / "int4", int4=True)
    floats, kept = load_lm(tmp_path / "float"), load_lm(tmp_path / "int4")
    assert kept.config["quantization"]["weights"] == "int4"
    layers = [m for m in kept.model.modules() if isinstance(m, Int4Linear)]
    assert len(layers) == sum(isinstance(m, torch.nn.Linear) for m in floats.model.modules())
    for layer in layers:
        layer.kernel = "dequant"  # exact in float32; the default kernel computes in bf16
    ids = floats.tokenizer.encode(TEXT[:24])
    assert torch.equal(_logits(kept, ids), _logits(floats, ids))
    if preset == "gpt2":  # a file whose matrices are not Q4_0 is refused by name, nothing written
        assert main(["export-gguf", str(run_dir), str(out), "--overwrite"]) == 0
        with pytest.raises(ValueError, match="another type in the file .*import without --int4"):
            import_gguf(out, tmp_path / "f32-int4", int4=True)
        assert not (tmp_path / "f32-int4").exists()


@pytest.mark.parametrize("type_name", [t for t in BLOCKS if t != "F32"])
def test_decoding_gives_the_bits_gguf_gives(type_name):
    """Random block bytes (the float16 scales kept finite): handformer's float32 equals gguf's."""
    per_block, size = BLOCKS[type_name]
    rng = np.random.default_rng(len(type_name))
    raw = rng.integers(0, 256, size=(6, 512 // per_block * size), dtype=np.uint8)
    blocks = raw.reshape(-1, 2 if per_block == 1 else size)
    scale_high_bytes = {1: [1], 32: [1], 256: [1, 3]}[per_block] if type_name != "Q6_K" else [209]
    for b in scale_high_bytes:
        blocks[:, b] &= 0x3F  # clears the top exponent bits: no inf / NaN scales
    expected = gguf.quants.dequantize(raw, getattr(QT, type_name))
    got = dequantize(torch.from_numpy(raw), type_name, (6, 512)).numpy()
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    with pytest.raises(ValueError, match="needs"):
        dequantize(torch.from_numpy(raw[:, 1:]), type_name, (6, 512))


# --- runs built here ---------------------------------------------------------------------------------

def _llama(v, **overrides):
    return CausalLMConfig.llama_style(**{**dict(vocab_size=v, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64,
                                                n_layers=2, max_positions=48, rope_theta=500.0), **overrides})


def _gpt2(v, **overrides):
    return CausalLMConfig.gpt2_style(**{**dict(vocab_size=v, d_model=32, n_heads=4, d_ff=128, n_layers=2,
                                               max_positions=48), **overrides})


LONGROPE = LongRopeScaling(short_factor=[1.0, 1.3], long_factor=[2.5, 7.1], original_max_positions=16)
SCALING = Llama3RopeScaling(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=16)
YARN = YarnRopeScaling(factor=4.0, original_max_positions=8, attention_factor=1.2)
# preset -> (config, GGUF architecture)
PRESETS = {
    "gpt2": (_gpt2, "gpt2"),
    "gpt2_no_bias": (lambda v: _gpt2(v, bias=False), "gpt2"),
    "gpt2_qkv_bias_only": (lambda v: _gpt2(v, bias=False, qkv_bias=True), "gpt2"),
    "llama_gqa": (_llama, "llama"),
    "llama_bias": (lambda v: _llama(v, bias=True), "llama"),
    "llama3_tied": (lambda v: _llama(v, tie_embeddings=True, rope_scaling=SCALING), "llama"),
    "qwen2": (lambda v: _llama(v, qkv_bias=True, tie_embeddings=True), "qwen2"),
    "gemma": (lambda v, **kw: _llama(v, norm="rmsnorm_offset", activation="geglu_tanh", scale_embeddings=True,
                               tie_embeddings=True, head_dim=16, n_kv_heads=1, **kw), "gemma"),
    "qwen3": (lambda v: _llama(v, qk_norm="head", head_dim=16), "qwen3"),
    "phi4_mini": (lambda v: _llama(v, rope_fraction=0.5, head_dim=8, tie_embeddings=True, rope_scaling=LONGROPE),
                  "phi3"),  # partial RoPE, LongRoPE
    "olmo2": (lambda v: _llama(v, norm_placement="reordered", qk_norm="width"), "olmo2"),
    "smollm3": (lambda v: _llama(v, n_layers=4, nope_layers=[3], tie_embeddings=True), "smollm3"),
    "mixtral": (lambda v: _llama(v, moe=MoEConfig(4, 2)), "llama"),  # llama.cpp's Llama with experts
    "qwen3moe": (lambda v: _llama(v, qk_norm="head", moe=MoEConfig(4, 2, d_expert=24, aux_loss_coef=0.001)),
                 "qwen3moe"),
    "gemma2": (lambda v: _gemma2(v), "gemma2"),
    "gemma2_no_window": (lambda v: _gemma2(v, sliding_window=None, global_layers=[]), "gemma2"),
    "gemma3": (lambda v: _gemma3(v), "gemma3"),
    "apertus": (lambda v: _llama(v, activation="xielu", qk_norm="head", head_dim=12), "apertus"),  # xIELU, q/k norms
    # YaRN with an attention factor of its own (rope.scaling.attn_factor), queries scaled by position
    "ministral3": (lambda v: _llama(v, rope_scaling=YARN, family=FamilyConfig(query_scale_beta=0.1,
                                                                              query_scale_positions=8)), "mistral3"),
}


def _gemma2(v, **overrides):
    # llama.cpp's Gemma 2: layer 1 of 2 global, scores scaled by head_dim, both soft-caps
    return PRESETS["gemma"][0](v, **{**dict(norm_placement="sandwich", sliding_window=4, global_layers=[1],
                                             attn_scale_dim=16, attn_softcap=50.0, logit_softcap=30.0),
                                     **overrides})


def _gemma3(v, **overrides):
    # llama.cpp's Gemma 3: five sliding layers to one global, the sliding ones with RoPE base 10000
    return PRESETS["gemma"][0](v, **{**dict(norm_placement="sandwich", qk_norm="head", n_layers=6,
                                             sliding_window=4, global_layers=[5], rope_local_theta=10000.0,
                                             attn_scale_dim=16), **overrides})


def _randomize(model, scale=0.3):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((1 if name.endswith("weight") else 0) + 0.2 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))
    return model.eval()


def _run(path, cfg, tokenizer, tokens=None, seed=0):
    torch.manual_seed(seed)
    save_lm_run(path, _randomize(build_causal_lm(cfg)), tokenizer, tokens or SpecialTokens(eos_id=2, pad_id=0))
    return path


def _logits(run, ids):
    with torch.no_grad():
        return run.model(torch.tensor([ids, ids[::-1]])).logits


def _same_run(a_dir, b_dir, norm_offset=False):
    """Two runs with the same weights (Gemma: the same gains 1 + w), settings, tokenizer, tokens and
    logits, bit for bit. Dropout acts only in training: GGUF has no place for it."""
    a, b = load_lm(a_dir), load_lm(b_dir)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert set(sa) == set(sb)
    for key in sa:
        if norm_offset and key.endswith("norm.weight"):
            assert torch.equal(1 + sa[key], 1 + sb[key]), key
        else:
            assert torch.equal(sa[key], sb[key]), key
    assert b.model.cfg == replace(a.model.cfg, dropout=0.0, attention_dropout=0.0)
    assert b.tokenizer.hf.to_str() == a.tokenizer.hf.to_str()
    assert b.tokens == a.tokens
    ids = a.tokenizer.encode(TEXT[:24])
    assert torch.equal(_logits(a, ids), _logits(b, ids))


@pytest.mark.parametrize("preset", list(PRESETS))
def test_import_of_the_f32_export_is_the_run_again(preset, tmp_path, capsys):
    tok = Tokenizer.train_char([TEXT])
    run_dir = _run(tmp_path / "run", PRESETS[preset][0](tok.vocab_size), tok,
                   SpecialTokens(bos_id=1 if "llama" in preset else None, eos_id=2, pad_id=0),
                   seed=sorted(PRESETS).index(preset))
    out = tmp_path / "model.gguf"
    assert main(["export-gguf", str(run_dir), str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"({PRESETS[preset][1]}), f32" in printed and "next: llama-completion -m" in printed
    file = read_gguf(out)
    assert file.architecture == PRESETS[preset][1]
    assert all(t.type_name == "F32" for t in file.tensors.values())
    assert ("output.weight" in file.tensors) == (not load_lm(run_dir).model.cfg.tie_embeddings)
    assert ("rope_freqs.weight" in file.tensors) == (preset == "llama3_tied")
    if preset == "qwen3moe":  # the experts stacked, as llama.cpp reads them
        assert file.tensors["blk.0.ffn_gate_exps.weight"].shape == (4, 24, 32)
        assert file.tensors["blk.1.ffn_down_exps.weight"].shape == (4, 32, 24)
        assert (file.metadata["qwen3moe.expert_count"], file.metadata["qwen3moe.expert_used_count"],
                file.metadata["qwen3moe.expert_feed_forward_length"]) == (4, 2, 24)
    if preset.startswith("gemma2"):  # llama.cpp's Gemma 2 always slides: no window = the context
        window = file.metadata["gemma2.attention.sliding_window"]
        assert window == (48 if preset == "gemma2_no_window" else 4)
        assert ("always slides" in printed) == (preset == "gemma2_no_window")
        assert (file.metadata["gemma2.attn_logit_softcapping"], file.metadata["gemma2.final_logit_softcapping"]) \
            == (50.0, 30.0)
    assert main(["import-gguf", str(out), str(tmp_path / "back")]) == 0
    assert "imported GGUF" in capsys.readouterr().out
    _same_run(run_dir, tmp_path / "back", norm_offset=preset.startswith("gemma"))


def test_llama_rows_are_permuted_to_pairs_and_rope_freqs_are_llama_3s_factors(tmp_path):
    """llama.cpp's Llama rotates adjacent pairs: q/k rows (x_0..x_{Dh/2-1}, y_0..) go to (x_0, y_0, ...),
    per head; Qwen2 keeps handformer's half-split rows. rope_freqs holds 1 / 4 / blended factors."""
    tok = Tokenizer.train_char([TEXT])
    for preset, permuted in (("llama3_tied", True), ("qwen2", False)):
        run_dir = _run(tmp_path / preset, PRESETS[preset][0](tok.vocab_size), tok)
        assert main(["export-gguf", str(run_dir), str(tmp_path / f"{preset}.gguf")]) == 0
        file = read_gguf(tmp_path / f"{preset}.gguf")
        k = load_lm(run_dir).model.state_dict()["layers.0.self_attn.k_proj.weight"]  # (Hkv*Dh, D)
        stored = file.tensors["blk.0.attn_k.weight"].to_torch()
        heads = k.view(2, 8, 32)  # Hkv = 2 heads of Dh = 8 rows
        pairs = torch.stack([heads[:, :4], heads[:, 4:]], dim=2).reshape(16, 32)
        assert torch.equal(stored, pairs if permuted else k)
    factors = read_gguf(tmp_path / "llama3_tied.gguf").tensors["rope_freqs.weight"].to_torch()
    assert factors.tolist()[1:] == [4.0, 4.0, 4.0] and 1 < factors[0] < 4  # wavelengths 6.3 | 30, 140, 660
    assert torch.equal(factors, rope_factors(_llama(tok.vocab_size, rope_scaling=SCALING)))


def test_llama_3_scaling_is_fitted_from_rope_freqs_in_a_file_without_handformers_keys(tmp_path, capsys):
    """convert_hf_to_gguf.py writes only rope_freqs.weight: the settings behind it are recovered
    (low_freq_factor taken as 1, which with the thresholds fixes the rest) and checked against it."""
    tok = Tokenizer.train_char([TEXT])
    scaling = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=16)
    cfg = _llama(tok.vocab_size, d_model=128, n_heads=2, n_kv_heads=1, rope_theta=1e4, rope_scaling=scaling)
    run_dir = _run(tmp_path / "run", cfg, tok)  # heads 64 wide: 5 of 32 frequencies blended
    assert main(["export-gguf", str(run_dir), str(tmp_path / "m.gguf")]) == 0
    keys = [k for k in read_gguf(tmp_path / "m.gguf").metadata if k.startswith("handformer.rope_scaling.")]
    assert len(keys) == 4
    _rewrite(tmp_path / "m.gguf", tmp_path / "converted.gguf", drop=keys)
    assert main(["import-gguf", str(tmp_path / "converted.gguf"), str(tmp_path / "back")]) == 0
    assert load_lm(tmp_path / "back").model.cfg.rope_scaling == scaling
    _rewrite(tmp_path / "m.gguf", tmp_path / "other.gguf", drop=keys, types={  # not Llama 3's curve
        "rope_freqs.weight": (QT.F32, np.linspace(1, 8, 32, dtype=np.float32))})
    _fails(capsys, ["import-gguf", str(tmp_path / "other.gguf"), str(tmp_path / "other")],
           "rope_freqs.weight is not Llama 3's frequency scaling")


# --- runs imported from Hugging Face -----------------------------------------------------------------

SIZE = dict(vocab_size=40, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            num_hidden_layers=2, max_position_embeddings=48, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ROPE = {"rope_type": "default", "rope_theta": 1e4}
HF_FAMILIES = {  # family -> (tiny Hugging Face model, GGUF architecture)
    "mistral": (lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        **SIZE, sliding_window=None, rope_parameters=ROPE)), "llama"),
    "phi3": (lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZE, tie_word_embeddings=False, rope_parameters=ROPE)), "phi3"),
    "qwen2": (lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SIZE, tie_word_embeddings=True, use_sliding_window=False, rope_parameters={**ROPE, "rope_theta": 1e6})),
              "qwen2"),
    "llama_tied": (lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **SIZE, tie_word_embeddings=True, rope_parameters=ROPE)), "llama"),
    "gpt2": (lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(  # transformers' GGUF GPT-2 needs
        vocab_size=40, n_embd=32, n_head=4, n_layer=2, n_positions=1024, bos_token_id=1, eos_token_id=2)),
             "gpt2"),  # 1024 positions and d_ff = 4 d_model: it reads neither key
    # transformers' GGUF loader reads no head width for Qwen3 (it takes Qwen3's 128), nor Gemma's
    # query scale (256), soft-caps (50, 30), Gemma 3's layer pattern (6) and local RoPE base (1e4):
    # the tiny models have those values, which are llama.cpp's too
    "qwen3": (lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **SIZE, head_dim=128, tie_word_embeddings=False, rope_parameters={**ROPE, "rope_theta": 1e6})), "qwen3"),
    "gemma2": (lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(  # layer 1 of 3 global
        **{**SIZE, "num_hidden_layers": 3}, head_dim=256, sliding_window=5, query_pre_attn_scalar=256,
        rope_parameters=ROPE)), "gemma2"),
    "gemma3": (lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(  # layer 5 of 7 global
        **{**SIZE, "num_hidden_layers": 7, "num_key_value_heads": 1}, head_dim=256, sliding_window=5,
        sliding_window_pattern=6, query_pre_attn_scalar=256,
        rope_parameters={"sliding_attention": ROPE, "full_attention": {**ROPE, "rope_theta": 1e6}})), "gemma3"),
    "qwen3_moe": (lambda: transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(  # experts 768 wide:
        **SIZE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=768,  # the loader reads no width
        norm_topk_prob=True, rope_parameters=ROPE)), "qwen3moe"),
}
WINDOWED = ("gemma2", "gemma3")  # the text below runs 6 windows of 5 past them
CHAT_TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def _hf_run(family, tmp_path, make=None):
    torch.manual_seed(sorted(HF_FAMILIES).index(family) if family in HF_FAMILIES else 99)
    hf_model = (make or HF_FAMILIES[family][0])()
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf_model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    Tokenizer.train_char([TEXT]).save(tmp_path / "hf" / "tokenizer.json")  # 26 of the model's 40 ids
    (tmp_path / "hf" / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    import_hf(tmp_path / "hf", tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.parametrize("family", list(HF_FAMILIES))
def test_transformers_reads_the_export_with_handformers_logits(family, tmp_path, capsys):
    run_dir = _hf_run(family, tmp_path)
    assert main(["export-gguf", str(run_dir), str(tmp_path / "model.gguf")]) == 0
    assert f"({HF_FAMILIES[family][1]}), f32" in capsys.readouterr().out
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="model.gguf",
                                                           dtype=torch.float32).eval()
    run = load_lm(run_dir)
    ids = run.tokenizer.encode(TEXT[:30])
    with torch.no_grad():
        expected = _logits(run, ids)
        assert expected.std() > 0.5  # far from trivial
        torch.testing.assert_close(hf(torch.tensor([ids, ids[::-1]])).logits, expected, atol=1e-5, rtol=1e-5)
    assert main(["import-gguf", str(tmp_path / "model.gguf"), str(tmp_path / "back")]) == 0
    _same_run(run_dir, tmp_path / "back", norm_offset=family.startswith("gemma"))
    back = load_lm(tmp_path / "back")
    assert back.config["source"]["model_type"] == {"mistral": "llama", "llama_tied": "llama",
                                                   "gemma3": "gemma3_text"}.get(family, family)
    if family in WINDOWED:
        assert (back.model.cfg.sliding_window, back.model.cfg.global_layers) == (5, [1] if family == "gemma2" else [5])
    assert (tmp_path / "back" / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    from handformer.generation.chat_template import load_chat_template

    rendered = load_chat_template(tmp_path / "back").render([{"role": "user", "content": "hi"}])
    assert rendered == "<s>user: hi\n"


LLAMA_CPP_ONLY = {  # what transformers' GGUF loader does not read: llama.cpp's slow test runs them
    # transformers reads a Llama file with experts as a dense Llama: wrong, so not compared
    "mixtral": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **SIZE, num_local_experts=4, num_experts_per_tok=2, rope_parameters=ROPE)),
    "phi4_mini": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(  # RoPE on 6 of 8 dims, LongRoPE
        **SIZE, tie_word_embeddings=True, original_max_position_embeddings=16, partial_rotary_factor=0.75,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.75,
                         "short_factor": [1.0, 1.1, 1.2], "long_factor": [1.5, 2.2, 2.9]})),
    "olmo2": lambda: transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**SIZE, rope_parameters=ROPE)),
    "smollm3": lambda: transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(  # layers 3 and 7 without RoPE
        **{**SIZE, "num_hidden_layers": 8}, rope_parameters={**ROPE, "rope_theta": 2e6})),
}
LLAMA_CPP_ONLY["granite"] = lambda: transformers.GraniteForCausalLM(transformers.GraniteConfig(  # its four constants
    **SIZE, embedding_multiplier=12.0, attention_multiplier=0.03125, residual_multiplier=0.22, logits_scaling=1.5,
    rope_parameters=ROPE))
LLAMA_CPP_ONLY.update(  # today's open families at odd sizes: 6 heads of 12, width 42
    seed_oss=lambda: transformers.SeedOssForCausalLM(transformers.SeedOssConfig(  # q/k/v biases
        **{**SIZE, "hidden_size": 42, "num_attention_heads": 6, "head_dim": 12}, rope_parameters=ROPE)),
    hunyuan=lambda: transformers.HunYuanDenseV1ForCausalLM(transformers.HunYuanDenseV1Config(  # norms after RoPE
        **{**SIZE, "hidden_size": 42, "num_attention_heads": 6, "head_dim": 12}, rope_parameters=ROPE)),
    ernie4_5=lambda: transformers.Ernie4_5ForCausalLM(transformers.Ernie4_5Config(  # RoPE on pairs, biases
        **{**SIZE, "hidden_size": 42, "num_attention_heads": 6, "head_dim": 12}, use_bias=True, rope_parameters=ROPE)),
)
LLAMA_CPP_ONLY["glm4"] = lambda: transformers.Glm4ForCausalLM(transformers.Glm4Config(  # four norms, half RoPE
    **{**SIZE, "hidden_size": 42, "num_attention_heads": 6, "head_dim": 12}, attention_bias=True,
    rope_parameters={**ROPE, "partial_rotary_factor": 0.5}))
LLAMA_CPP_ONLY["exaone4"] = lambda: transformers.Exaone4ForCausalLM(transformers.Exaone4Config(  # 1.2B's: tied,
    **{**SIZE, "hidden_size": 42, "num_attention_heads": 6, "head_dim": 12}, sliding_window=None,  # no window,
    layer_types=["full_attention"] * 2, tie_word_embeddings=True, rope_parameters={  # Llama 3's scaling
        "rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}))


@pytest.mark.parametrize("family", list(LLAMA_CPP_ONLY))
def test_imported_mixtral_phi4_mini_olmo2_and_smollm3_go_to_gguf_and_back(family, tmp_path, capsys):
    run_dir = _hf_run(family, tmp_path, LLAMA_CPP_ONLY[family])
    assert main(["export-gguf", str(run_dir), str(tmp_path / "model.gguf")]) == 0
    arch = {"phi4_mini": "phi3", "mixtral": "llama", "hunyuan": "hunyuan-dense"}.get(family, family)
    printed = capsys.readouterr().out
    assert f"({arch}), f32" in printed
    if family == "phi4_mini":  # the rotated dims, LongRoPE's factors and its attention factor
        file = read_gguf(tmp_path / "model.gguf")
        assert (file.metadata["phi3.rope.dimension_count"], file.metadata["phi3.attention.key_length"]) == (6, 8)
        assert file.tensors["rope_factors_long.weight"].to_torch().tolist() == pytest.approx([1.5, 2.2, 2.9])
        assert file.metadata["phi3.rope.scaling.original_context_length"] == 16
        assert file.metadata["phi3.rope.scaling.attn_factor"] == pytest.approx(math.sqrt(1 + math.log(3) / math.log(16)))
        assert "LongRoPE's long factors" in printed
    names = set(read_gguf(tmp_path / "model.gguf").tensors)
    assert ("blk.0.attn_q_norm.weight" in names) == (family in ("olmo2", "hunyuan", "exaone4"))
    assert ("blk.0.post_ffw_norm.weight" in names) == (family in ("olmo2", "glm4", "exaone4"))
    if family == "glm4":  # llama.cpp turns adjacent pairs of 6 dims a head: the checkpoint's rows, as they are
        file, hf = read_gguf(tmp_path / "model.gguf"), load_file(tmp_path / "hf" / "model.safetensors")
        assert file.metadata["glm4.rope.dimension_count"] == 6
        for ours, theirs in (("attn_q.weight", "q_proj.weight"), ("attn_k.bias", "k_proj.bias")):
            assert torch.equal(file.tensors[f"blk.1.{ours}"].to_torch(), hf[f"model.layers.1.self_attn.{theirs}"])
    assert main(["import-gguf", str(tmp_path / "model.gguf"), str(tmp_path / "back")]) == 0
    _same_run(run_dir, tmp_path / "back")
    back = load_lm(tmp_path / "back")
    assert back.config["source"]["model_type"] == {"phi4_mini": "phi3", "hunyuan": "hunyuan_v1_dense"}.get(family, family)
    assert back.model.cfg.nope_layers == ([3, 7] if family == "smollm3" else [])
    assert family != "granite" or back.model.cfg.family == load_lm(run_dir).model.cfg.family  # the four constants
    if family == "exaone4":  # at 64 layers (the 32B) llama.cpp slides: refused, never read without windows
        _rewrite(tmp_path / "model.gguf", tmp_path / "deep.gguf", drop=["exaone4.block_count"],
                 values={"exaone4.block_count": (64, gguf.GGUFValueType.UINT32)})
        _fails(capsys, ["import-gguf", str(tmp_path / "deep.gguf"), str(tmp_path / "deep")],
               "64 layers, where llama.cpp's EXAONE 4 slides three layers in four")


def test_a_phi3_window_is_written_and_read_back(tmp_path, capsys):
    """llama.cpp's Phi-3 has the key (0 = none), though the pinned version runs without the window."""
    run_dir = _hf_run("phi3_window", tmp_path, lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZE, sliding_window=5, tie_word_embeddings=False, rope_parameters=ROPE)))
    assert main(["export-gguf", str(run_dir), str(tmp_path / "m.gguf")]) == 0
    assert "the sliding window (5) is written" in capsys.readouterr().out
    assert read_gguf(tmp_path / "m.gguf").metadata["phi3.attention.sliding_window"] == 5
    assert main(["import-gguf", str(tmp_path / "m.gguf"), str(tmp_path / "back")]) == 0
    _same_run(run_dir, tmp_path / "back")
    assert load_lm(tmp_path / "back").model.cfg.sliding_window == 5


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    """Two tiny character models trained for 40 steps on the embedded corpus: GPT-2 (1024 positions
    and d_ff = 4 d_model, as transformers' GGUF GPT-2 needs) and Llama."""
    root = tmp_path_factory.mktemp("trained")
    base = ["train", "--config", str(ROOT / "configs" / "tiny_lm.toml"), "--set", "train.progress=false",
            "--set", "train.device=cpu", "--set", "train.steps=40"]
    assert main([*base, "--out", str(root / "gpt2"), "--set", "model.d_ff=128",
                 "--set", "model.max_positions=1024"]) == 0
    assert main([*base, "--out", str(root / "llama"), "--set", "model.preset=llama",
                 "--set", "model.n_kv_heads=1", "--set", "model.d_ff=64"]) == 0
    for name, settings in TODAYS.items():
        assert main([*base, "--out", str(root / name), "--set", "model.preset=llama", "--set", "model.n_kv_heads=1",
                     *[a for pair in settings for a in ("--set", f"model.{pair}")]]) == 0
    return root


# Today's families trained here with the values transformers' GGUF loader assumes (it reads no head
# width for Qwen3, no expert width for Qwen3-MoE, nor Gemma's query scale, soft-caps, layer pattern
# or local RoPE base)
_GEMMA_SETTINGS = ["norm=rmsnorm_offset", "activation=geglu_tanh", "scale_embeddings=true", "tie_embeddings=true",
                   "norm_placement=sandwich", "head_dim=256", "attn_scale_dim=256", "sliding_window=8"]
TODAYS = {
    "qwen3": ["qk_norm=head", "head_dim=128", "rope_theta=1e6"],
    "qwen3moe": ["qk_norm=head", 'moe={"n_experts": 4, "top_k": 2, "d_expert": 768}'],  # the loader's width
    "gemma2": [*_GEMMA_SETTINGS, "n_layers=2", "global_layers=[1]", "attn_softcap=50.0", "logit_softcap=30.0"],
    "gemma3": [*_GEMMA_SETTINGS, "qk_norm=head", "n_layers=6", "global_layers=[5]", "rope_theta=1e6",
               "rope_local_theta=1e4"],
}


LIMITS = {"f32": 1e-5, "f16": 1e-2, "q8_0": 5e-2}  # max |delta logit| against handformer's float32


@pytest.mark.parametrize("name", ["gpt2", "llama", *TODAYS])
def test_f16_and_q8_0_exports_stay_close_in_transformers(trained, name, tmp_path, capsys):
    run = load_lm(trained / name)
    ids = run.tokenizer.encode("The Python Tutorial: an informal introduction to the language")[:30]
    expected = _logits(run, ids)
    for type_name, limit in LIMITS.items():
        assert main(["export-gguf", str(trained / name), str(tmp_path / f"{type_name}.gguf"), "--type", type_name]) == 0
        types = {t.type_name for t in read_gguf(tmp_path / f"{type_name}.gguf").tensors.values()}
        assert types == {"f32": {"F32"}, "f16": {"F32", "F16"}, "q8_0": {"F32", "Q8_0"}}[type_name]
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=f"{type_name}.gguf",
                                                               dtype=torch.float32).eval()
        with torch.no_grad():
            delta = (hf(torch.tensor([ids, ids[::-1]])).logits - expected).abs().max().item()
        with capsys.disabled():
            print(f"\n  {name} {type_name}: max |delta logit| = {delta:.2e} (limit {limit:g})", end="")
        assert delta <= limit, (type_name, delta)


# --- tokenizers rebuilt from the vocabulary keys -----------------------------------------------------

def _tokenizers():
    text = TEXT * 3 + "naïve café — 𝄞 déjà"
    found = {"char": Tokenizer.train_char([text]), "bpe": Tokenizer.train_bpe([text * 20], 300)}
    if STORIES is not None:
        from handformer.convert.llama2c_tokenizer import llama2c_tokenizer

        found["llama2c"] = llama2c_tokenizer(STORIES / "tok512.bin", 512)
    return found


@pytest.mark.parametrize("kind", ["char", "bpe", "llama2c"])
def test_a_tokenizer_rebuilt_from_the_vocabulary_encodes_as_the_runs(kind, tmp_path):
    tokenizers = _tokenizers()
    if kind not in tokenizers:
        dataset_file("stories260K")
    tok = tokenizers[kind]
    run_dir = _run(tmp_path / "run", _llama(tok.vocab_size + 3), tok, SpecialTokens(bos_id=1, eos_id=2))
    assert main(["export-gguf", str(run_dir), str(tmp_path / "m.gguf")]) == 0
    metadata = read_gguf(tmp_path / "m.gguf").metadata
    assert metadata["tokenizer.ggml.model"] == ("llama" if kind == "llama2c" else "gpt2")
    assert len(metadata["tokenizer.ggml.tokens"]) == tok.vocab_size + 3  # padded to the model's vocabulary
    assert metadata["tokenizer.ggml.tokens"][-1] == f"[PAD{tok.vocab_size + 2}]"
    if kind == "char":
        assert metadata["tokenizer.ggml.tokens"][tok.encode(" ")[0]] == "Ġ"  # byte-level form
        assert len(metadata["tokenizer.ggml.merges"]) == 3 + 2 + 3  # ï é à: 2 bytes, —: 3, 𝄞: 4
    del metadata["tokenizer.huggingface.json"]
    rebuilt = tokenizer_from_gguf(metadata, tok.vocab_size + 3, "m.gguf")
    sample = TEXT + " Once upon a time, there was a little girl named Lily. déjà 𝄞 — naïve\n"
    assert rebuilt.encode(sample) == tok.encode(sample)
    assert rebuilt.decode(tok.encode(sample)) == tok.decode(tok.encode(sample))
    assert rebuilt.is_char == tok.is_char


def test_stories260k_goes_to_gguf_and_back(tmp_path):
    stories = dataset_file("stories260K")
    assert main(["import-llama2c", str(stories / "stories260K.bin"), str(stories / "tok512.bin"),
                 str(tmp_path / "run")]) == 0
    assert main(["export-gguf", str(tmp_path / "run"), str(tmp_path / "s.gguf")]) == 0
    metadata = read_gguf(tmp_path / "s.gguf").metadata
    assert (metadata["tokenizer.ggml.eos_token_id"], metadata["tokenizer.ggml.eot_token_id"]) == (2, 1)
    assert metadata["tokenizer.ggml.add_bos_token"] and metadata["tokenizer.ggml.add_space_prefix"]
    assert main(["import-gguf", str(tmp_path / "s.gguf"), str(tmp_path / "back")]) == 0
    _same_run(tmp_path / "run", tmp_path / "back")
    assert load_lm(tmp_path / "back").tokens.eos_ids == [2, 1]  # llama2.c stops at BOS too


# --- what else a run can be --------------------------------------------------------------------------

def test_a_lora_run_exports_merged_and_a_quantized_run_from_its_weights(trained, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 40)
    sets = ["train.progress=false", "train.device=cpu", f"data.path={text}", "data.block_size=16",
            "data.batch_size=4", "data.eval_batches=1", "train.steps=4", "train.eval_every=4", "train.warmup=1",
            "train.lr=1e-2", "train.lora.rank=4", "train.lora.alpha=8"]
    assert main(["train", "--init-from", str(trained / "llama"), "--out", str(tmp_path / "lora"),
                 *[a for p in sets for a in ("--set", p)]]) == 0
    assert main(["export-gguf", str(tmp_path / "lora"), str(tmp_path / "lora.gguf")]) == 0
    assert "LoRA adapters are merged" in capsys.readouterr().out
    assert main(["import-gguf", str(tmp_path / "lora.gguf"), str(tmp_path / "lora-back")]) == 0
    lora, back = load_lm(tmp_path / "lora"), load_lm(tmp_path / "lora-back")
    ids = lora.tokenizer.encode("The tutorial")
    torch.testing.assert_close(_logits(back, ids), _logits(lora, ids), atol=1e-5, rtol=1e-5)

    from handformer.inference.quant import dequantize_int8
    from handformer.inference.quant_int4 import dequantize_int4, unpack_nibbles

    for kind in ("int8", "int4", "bf16"):
        assert main(["quantize", str(trained / "llama"), str(tmp_path / kind), f"--{kind}"]) == 0
        assert main(["export-gguf", str(tmp_path / kind), str(tmp_path / f"{kind}.gguf"), "--overwrite"]) == 0
        assert f"the run is quantized ({kind})" in capsys.readouterr().out
        assert main(["import-gguf", str(tmp_path / f"{kind}.gguf"), str(tmp_path / f"{kind}-back")]) == 0
        state = load_lm(tmp_path / kind).model.state_dict()
        layer = "layers.0.ffn.up_proj"
        weight = load_lm(tmp_path / f"{kind}-back").model.state_dict()[f"{layer}.weight"]
        if kind == "int8":
            expected = dequantize_int8(state[f"{layer}.weight"], state[f"{layer}.scales"])
        elif kind == "int4":
            expected = dequantize_int4(unpack_nibbles(state[f"{layer}.weight"]), state[f"{layer}.scales"],
                                       state[f"{layer}.zeros"])
        else:
            expected = state[f"{layer}.weight"].float()
        assert torch.equal(weight, expected), kind
        quantized, exported = load_lm(tmp_path / kind), load_lm(tmp_path / f"{kind}-back")
        delta = (_logits(quantized, ids) - _logits(exported, ids)).abs().max().item()
        assert delta < 0.05, (kind, delta)  # the quantized kernels compute in bf16


def _rewrite(src, dst, drop=(), values=None, types=None, arch=None, drop_tensor=None):
    """A copy of a GGUF file with keys dropped or set, tensors re-encoded (`types`: name -> (GGML
    type, raw bytes or None to quantize with gguf)) or another architecture named, written with the
    gguf package alone: a file as another tool would write it."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, arch or reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop:
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        if sub == gguf.GGUFValueType.ARRAY:  # an empty array (a character vocabulary's merges), which
            continue  # the gguf writer refuses; handformer's importer reads the missing key as empty
        writer.add_key_value(name, field.contents(), field.types[0], sub)
    for name, (value, vtype) in (values or {}).items():
        writer.add_key_value(name, value, vtype)
    for t in reader.tensors:
        if t.name == drop_tensor:
            continue
        array = np.array(t.data)
        shape = [int(n) for n in reversed(t.shape.tolist())]
        if types and t.name in types:
            qtype, raw = types[t.name]
            raw = raw if raw is not None else gguf.quants.quantize(array.reshape(shape).astype(np.float32), qtype)
            writer.add_tensor(t.name, raw, raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, array.reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _k_quant_bytes(shape, qtype, seed):
    per_block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, size=(shape[0], shape[1] // per_block * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    for b in ([209] if qtype == QT.Q6_K else [1, 3]):
        blocks[:, b] &= 0x1F  # small finite scales
    return raw


def test_a_file_from_elsewhere_imports_with_its_tensors_decoded(tmp_path, capsys):
    """A 256-wide Llama whose matrices are F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K, without
    tokenizer.json or handformer's keys, as llama.cpp's tools write them: every tensor comes back
    as gguf.quants.dequantize decodes it, the tokenizer from the vocabulary."""
    tok = Tokenizer.train_bpe([TEXT * 40], 300)
    cfg = _llama(tok.vocab_size, d_model=256, n_heads=4, n_kv_heads=4, d_ff=256, n_layers=1)
    run_dir = _run(tmp_path / "run", cfg, tok, SpecialTokens(bos_id=1, eos_id=2), seed=3)
    assert main(["export-gguf", str(run_dir), str(tmp_path / "m.gguf")]) == 0
    chosen = {"blk.0.attn_q.weight": QT.Q4_K, "blk.0.attn_k.weight": QT.Q5_K, "blk.0.attn_v.weight": QT.Q6_K,
              "blk.0.attn_output.weight": QT.Q4_0, "blk.0.ffn_gate.weight": QT.Q8_0,
              "blk.0.ffn_up.weight": QT.F16, "blk.0.ffn_down.weight": QT.BF16}
    types = {n: (q, _k_quant_bytes((256, 256), q, i) if "K" in q.name else None)
             for i, (n, q) in enumerate(chosen.items())}
    _rewrite(tmp_path / "m.gguf", tmp_path / "other.gguf", types=types,
             drop=("tokenizer.huggingface.json",))
    assert main(["import-gguf", str(tmp_path / "other.gguf"), str(tmp_path / "back")]) == 0
    reader = gguf.GGUFReader(tmp_path / "other.gguf")
    state = load_lm(tmp_path / "back").model.state_dict()
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "ffn.gate_proj", "ffn_up": "ffn.up_proj",
             "ffn_down": "ffn.down_proj"}
    for t in reader.tensors:
        part = t.name.split(".")[2] if t.name.startswith("blk.") else None
        if part in names and t.name.endswith(".weight"):
            w = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).reshape(256, 256)
            if part in ("attn_q", "attn_k"):  # back from llama.cpp's pairs to half-split rows
                w = w.view(4, 32, 2, 256).transpose(1, 2).reshape(256, 256)
            assert torch.equal(state[f"layers.0.{names[part]}.weight"], w), t.name
    sample = TEXT + "whether to be"
    assert load_lm(tmp_path / "back").tokenizer.encode(sample) == tok.encode(sample)
    counted = json.loads((tmp_path / "back" / "config.json").read_text())["source"]["tensor_types"]
    assert counted == {**{q.name: 1 for q in chosen.values()}, "F32": len(reader.tensors) - len(chosen)}


# --- refusals ----------------------------------------------------------------------------------------

def _fails(capsys, argv, *expected):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    for text in expected:
        assert re.search(text, err), (text, err)
    return err


def test_every_refusal_is_one_line(tmp_path, capsys):
    tok = Tokenizer.train_char([TEXT])
    v = tok.vocab_size
    runs = {
        "post_norm": CausalLMConfig.gpt2_style(vocab_size=v, d_model=32, n_heads=4, d_ff=64, n_layers=1,
                                               norm_placement="post"),
        "baby_gpt": _gpt2(v, activation="gelu", bias=False),  # configs/shakespeare_char.toml's exact GELU
        "sinusoidal": _gpt2(v, position="sinusoidal"),
        "window": _llama(v, sliding_window=5),
        "gemma_untied": replace(PRESETS["gemma"][0](v), tie_embeddings=False),
    }
    for name, cfg in runs.items():
        _run(tmp_path / name, cfg, tok)
    out = str(tmp_path / "x.gguf")
    _fails(capsys, ["export-gguf", str(tmp_path / "post_norm"), out], "norm_placement='post'")
    _fails(capsys, ["export-gguf", str(tmp_path / "baby_gpt"), out], r"activation='gelu' \(GPT-2 uses the tanh GELU")
    _fails(capsys, ["export-gguf", str(tmp_path / "sinusoidal"), out], "position='sinusoidal' maps to no llama.cpp")
    _fails(capsys, ["export-gguf", str(tmp_path / "window"), out], "sliding_window=5 .Llama has no sliding-window")
    _fails(capsys, ["export-gguf", str(tmp_path / "gemma_untied"), out], "tie_embeddings=False")
    from helpers import make_translation_run

    _fails(capsys, ["export-gguf", str(make_translation_run(tmp_path / "translation")), out],
           "is a translation run .*decoder-only")
    _fails(capsys, ["export-gguf", str(tmp_path / "nothing"), out], "nothing")
    run_dir = _run(tmp_path / "ok", _llama(v), tok)
    assert main(["export-gguf", str(run_dir), out]) == 0
    capsys.readouterr()
    _fails(capsys, ["export-gguf", str(run_dir), out], "exists; choose another file or pass --overwrite")
    _fails(capsys, ["export-gguf", str(run_dir), str(tmp_path)], "is a directory")
    with pytest.raises(SystemExit) as exit_info:  # argparse: exit 2 with the choices named
        main(["export-gguf", str(run_dir), out, "--type", "q3_k"])
    assert exit_info.value.code == 2 and "invalid choice: 'q3_k'" in capsys.readouterr().err

    # import: broken files, other architectures, tensor types and settings handformer lacks
    good = Path(out).read_bytes()
    broken = {"empty": b"", "garbage": b"not a gguf file at all" * 10, "truncated": good[: len(good) // 2],
              "header_only": good[:24]}
    for name, data in broken.items():
        (tmp_path / f"{name}.gguf").write_bytes(data)
        _fails(capsys, ["import-gguf", str(tmp_path / f"{name}.gguf"), str(tmp_path / name)],
               r"(is truncated|is not a readable GGUF file)")
        assert not (tmp_path / name).exists()
    _fails(capsys, ["import-gguf", str(tmp_path / "absent.gguf"), str(tmp_path / "r")], "no GGUF file at")
    string, uint32 = gguf.GGUFValueType.STRING, gguf.GGUFValueType.UINT32
    bpe = str(tmp_path / "bpe.gguf")
    variants = {  # name -> (rewrite arguments, the message)
        "qwen2moe": (dict(arch="qwen2moe"), "'qwen2moe' model: Qwen2-MoE has a mixture of experts and a shared expert, which import-gguf does not read yet .`handformer import-hf` reads its Hugging Face checkpoint, model_type 'qwen2_moe'."),
        "mamba": (dict(arch="mamba"), "'mamba' model; import-gguf reads llama, qwen2, qwen3, qwen3moe, gemma, gemma2, gemma3, olmo2, smollm3, phi3, gpt2"),
        "yarn": (dict(values={"llama.rope.scaling.type": ("yarn", string)}), "'yarn': rope scaling of that type"),
        "experts": (dict(values={"llama.expert_count": (8, uint32)}),  # Mixtral, without its experts
                    "lacks llama.expert_used_count, which handformer needs"),
        "qwen2_experts": (dict(values={"qwen2.expert_count": (8, uint32)}, src=str(tmp_path / "qwen2.gguf")),
                          "qwen2.expert_count=8: a mixture-of-experts feed-forward"),
        "q4_1": (dict(types={"blk.0.attn_q.weight": (QT.Q4_1, None)}), r"blk\.0\.attn_q\.weight \(Q4_1\)"),
        "no_attn_q": (dict(drop_tensor="blk.0.attn_q.weight"), r"missing tensors \(1\): blk\.0\.attn_q\.weight"),
        "heads": (dict(values={"llama.attention.head_count": (8, uint32)}), "shape mismatches"),
        "pre": (dict(drop=("tokenizer.huggingface.json",), values={"tokenizer.ggml.pre": ("tekken", string)},
                     src=bpe), "tokenizer.ggml.pre = 'tekken'"),
    }
    bpe_tok = Tokenizer.train_bpe([TEXT * 30], 280)
    _run(tmp_path / "bpe", _llama(bpe_tok.vocab_size), bpe_tok)
    _run(tmp_path / "qwen2", PRESETS["qwen2"][0](v), tok)
    assert main(["export-gguf", str(tmp_path / "qwen2"), str(tmp_path / "qwen2.gguf")]) == 0
    assert main(["export-gguf", str(tmp_path / "bpe"), bpe]) == 0
    for name, (rewrite, expected) in variants.items():
        _rewrite(rewrite.pop("src", out), tmp_path / f"{name}.gguf", **rewrite)
        _fails(capsys, ["import-gguf", str(tmp_path / f"{name}.gguf"), str(tmp_path / name)], expected)
        assert not (tmp_path / name).exists()
    assert main(["import-gguf", out, str(tmp_path / "imported")]) == 0
    capsys.readouterr()
    _fails(capsys, ["import-gguf", out, str(tmp_path / "imported")], "already holds a run")


def test_a_crash_while_writing_leaves_no_file(tmp_path, monkeypatch):
    tok = Tokenizer.train_char([TEXT])
    run_dir = _run(tmp_path / "run", _llama(tok.vocab_size), tok)

    def crash(self, *args, **kwargs):
        raise KeyboardInterrupt  # as a kill in the middle of the tensor data would

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", crash)
    assert main(["export-gguf", str(run_dir), str(tmp_path / "m.gguf")]) == 130  # one line, no traceback
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no m.gguf, no temporary file


def test_the_architecture_table_names_llama_cpps_tensors():
    """Every tensor name in the table is one llama.cpp's gguf package knows for that architecture."""
    arch_of = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}  # "hunyuan-dense" too
    for arch, family in FAMILIES.items():
        known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch_of[arch]]}
        for name in family.tensors:
            base = name.removesuffix(".weight").removesuffix(".bias")  # Qwen3.5's blk.{i}.ssm_a has neither
            assert base.replace("{i}", "{bid}") in known, (arch, name)


@pytest.mark.parametrize("overrides, setting", [
    (dict(moe=MoEConfig(4, 2, d_shared=16)), r"moe=MoEConfig\(.*d_shared=16"),  # Qwen2-MoE's shared expert
    (dict(sliding_window=4, global_layers=[1]), r"global_layers=\[1\]"),
    (dict(rope_scaling=LinearRopeScaling(2.0)), r"rope_scaling=LinearRopeScaling\(factor=2.0"),
    (dict(logit_softcap=30.0), "logit_softcap=30.0"),
])
def test_todays_family_settings_are_refused_by_name(tmp_path, capsys, overrides, setting):
    """A run with a setting of today's families that export-gguf writes no tensor or key for yet (q/k
    norms, experts, partial RoPE, layers without RoPE, ...) is refused by that setting before
    anything is written: never written as a Llama that llama.cpp would run wrong."""
    tok = Tokenizer.train_char([TEXT])
    torch.manual_seed(0)
    model = build_causal_lm(_llama(tok.vocab_size, **overrides))
    save_lm_run(tmp_path / "run", model, tok, SpecialTokens(eos_id=2, pad_id=0))
    _fails(capsys, ["export-gguf", str(tmp_path / "run"), str(tmp_path / "m.gguf")], setting,
           "export-hf writes this run for transformers")
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("preset, overrides, message", [
    ("qwen3", dict(sliding_window=4), r"sliding_window=4 \(Qwen3 has no sliding-window attention in llama.cpp\)"),
    ("gemma2", dict(global_layers=[0]), r"global_layers=\[0\] \(llama.cpp's Gemma 2 makes layer i global when "
               r"i % 2 = 1: \[1\] for 2 layers\)"),
    ("gemma2", dict(attn_scale_dim=24), r"attn_scale_dim=24 \(llama.cpp's Gemma 2 divides scores by sqrt\(head_dim\)"),
    ("gemma2", dict(attn_softcap=None), "attn_softcap=None .llama.cpp's Gemma 2 always soft-caps scores"),
    ("gemma2", dict(logit_softcap=None), "logit_softcap=None .llama.cpp's Gemma 2 always soft-caps logits"),
    ("gemma3", dict(rope_local_theta=5e4), r"rope_local_theta=50000.0 \(llama.cpp's Gemma 3 turns the sliding "
               "layers' RoPE with base 10000"),
    ("gemma3", dict(global_layers=[2, 5]), r"global_layers=\[2, 5\] .*\[5\] for 6 layers"),
    ("qwen3moe", dict(moe=MoEConfig(4, 2, normalize=False)), "moe.normalize=False .llama.cpp's Qwen3-MoE rescales"),
    ("smollm3", dict(nope_layers=[1]), r"nope_layers=\[1\] \(llama.cpp's SmolLM3 leaves RoPE out of layer i when "
                r"\(i \+ 1\) % 4 = 0: \[3\] for 4 layers\)"),
    # (norms after the sublayers with q/k norms per head are EXAONE 4's, which llama.cpp writes)
    ("olmo2", dict(qk_norm="none"), "qk_norm='none' .OLMo 2 normalises queries and keys over their whole width"),
    ("gemma3", dict(logit_softcap=30.0), "logit_softcap=30.0 .export-gguf writes no soft-capped logits for Gemma 3"),
    # reordered norms with q/k norms per head are EXAONE 4's, which llama.cpp slides only at 64 layers
    ("olmo2", dict(qk_norm="head", sliding_window=4, global_layers=[1], nope_layers=[1]),
     r"sliding_window=4 \(EXAONE 4 slides only in its 64-layer model in llama.cpp"),
    ("olmo2", dict(qk_norm="head", n_layers=64), r"n_layers=64 \(llama.cpp's EXAONE 4 slides three layers in four"),
    ("apertus", dict(tie_embeddings=True), r"tie_embeddings=True \(Apertus has an output head of its own in llama"),
    ("ministral3", dict(sliding_window=4), r"sliding_window=4 \(Ministral 3 has no sliding-window attention in llama"),
    ("ministral3", dict(rope_scaling=replace(YARN, truncate=False)),
     r"rope_scaling.truncate=False \(llama.cpp's Ministral 3 rounds YaRN's ramp to whole dims\)"),
    ("ministral3", dict(family=FamilyConfig(query_scale_beta=0.1, query_scale_positions=16)),
     r"query_scale_positions=16 with YaRN's original_max_positions=8"),
])
def test_what_llama_cpps_qwen3_and_gemmas_fix_is_refused_by_name(tmp_path, capsys, preset, overrides, message):
    """llama.cpp fixes Gemma 2/3's layer pattern, query scale and local RoPE base, and Gemma 2's
    soft-caps are always on: a run with other values is refused by the setting, nothing written."""
    tok = Tokenizer.train_char([TEXT])
    _run(tmp_path / "run", replace(PRESETS[preset][0](tok.vocab_size), **overrides), tok)
    _fails(capsys, ["export-gguf", str(tmp_path / "run"), str(tmp_path / "m.gguf")], message)
    assert not (tmp_path / "m.gguf").exists()


def test_gemma2_and_longrope_files_without_handformers_keys_import_as_llama_cpp_reads_them(tmp_path, capsys):
    """A Gemma 2 file with no window or soft-cap keys reads llama.cpp's defaults (a 4096 window, caps
    50 and 30); a LongRoPE file without handformer's exact lists takes the attention factor from
    rope.scaling.attn_factor and computes what the run computes."""
    tok = Tokenizer.train_char([TEXT])
    run_dir = _run(tmp_path / "gemma2", _gemma2(tok.vocab_size, attn_softcap=20.0, logit_softcap=10.0), tok)
    assert main(["export-gguf", str(run_dir), str(tmp_path / "g.gguf")]) == 0
    _rewrite(tmp_path / "g.gguf", tmp_path / "g2.gguf", drop=("gemma2.attention.sliding_window",
             "gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"))
    assert main(["import-gguf", str(tmp_path / "g2.gguf"), str(tmp_path / "g-back")]) == 0
    cfg = load_lm(tmp_path / "g-back").model.cfg
    assert (cfg.sliding_window, cfg.global_layers, cfg.attn_softcap, cfg.logit_softcap) == (None, [], 50.0, 30.0)

    run_dir = _hf_run("phi4_mini", tmp_path, LLAMA_CPP_ONLY["phi4_mini"])
    assert main(["export-gguf", str(run_dir), str(tmp_path / "p.gguf")]) == 0
    _rewrite(tmp_path / "p.gguf", tmp_path / "p2.gguf", drop=tuple(LONGROPE_KEYS.values()))
    capsys.readouterr()
    assert main(["import-gguf", str(tmp_path / "p2.gguf"), str(tmp_path / "p-back")]) == 0
    run, back = load_lm(run_dir), load_lm(tmp_path / "p-back")
    factor = math.sqrt(1 + math.log(3) / math.log(16))
    assert back.model.cfg.rope_scaling.attention_factor == pytest.approx(factor, rel=1e-7)
    assert back.model.cfg.rope_scaling.long_factor == pytest.approx([1.5, 2.2, 2.9], rel=1e-7)
    ids = run.tokenizer.encode(TEXT[:30])  # past the original context of 16: the long factors
    torch.testing.assert_close(_logits(back, ids), _logits(run, ids), atol=1e-5, rtol=1e-5)


# --- Apertus and Ministral 3: llama.cpp's apertus and mistral3 -----------------------------------------

ODD = {**SIZE, "hidden_size": 42, "num_attention_heads": 6, "head_dim": 16, "intermediate_size": 46,
       "max_position_embeddings": 96}
LLAMA_CPP_NEW = {  # family -> (tiny Hugging Face model at odd sizes, GGUF architecture)
    "apertus": (lambda: transformers.ApertusForCausalLM(transformers.ApertusConfig(  # Llama 3 scaling: 2 of 8
        **ODD, rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0,  # frequencies blended
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
                "apertus"),
    "ministral3": (lambda: transformers.Ministral3ForCausalLM(transformers.Ministral3Config(  # YaRN 8 over 8,
        **ODD, sliding_window=None, rope_parameters={  # queries scaled from positions 8, 16, ...
            "rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0, "original_max_position_embeddings": 8,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5})),
                   "mistral3"),
}


def _gguf_keys(arch):
    """Every metadata key name the gguf package (llama.cpp's) defines, for `arch`."""
    classes = [c for c in vars(gguf.Keys).values() if isinstance(c, type)]
    return {v.replace("{arch}", arch) for c in classes for v in vars(c).values() if isinstance(v, str) and "." in v}


@pytest.mark.parametrize("family", list(LLAMA_CPP_NEW))
def test_apertus_and_ministral3_go_to_llama_cpps_names_and_back(family, tmp_path, capsys):
    """The export names only tensors and keys that llama.cpp's gguf package defines for the
    architecture; the xIELU numbers, YaRN and the query scale are in its keys; import-gguf gives
    the run back (the same logits, bit for bit) and transformers' logits, with handformer's exact
    YaRN keys and without them (as llama.cpp's converter writes the file)."""
    make, arch = LLAMA_CPP_NEW[family]
    run_dir = _hf_run(family, tmp_path, make)
    assert main(["export-gguf", str(run_dir), str(tmp_path / "m.gguf")]) == 0
    assert f"({arch}), f32" in capsys.readouterr().out
    file = read_gguf(tmp_path / "m.gguf")
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[arch.upper()]]}
    assert {re.sub(r"^blk\.\d+\.", "blk.{bid}.", n).rsplit(".", 1)[0] for n in file.tensors} <= known
    ours = {k for k in file.metadata if not k.startswith(("tokenizer.", "general.", "handformer."))}
    assert ours <= _gguf_keys(arch), ours - _gguf_keys(arch)
    hf = load_file(tmp_path / "hf" / "model.safetensors")
    if family == "apertus":  # the alphas before their softplus, as the checkpoint holds them
        for name in ("alpha_p", "alpha_n", "beta", "eps"):
            assert file.metadata[gguf.Keys.xIELU.__dict__[name.upper()]] == [
                hf[f"model.layers.{i}.mlp.act_fn.{name}"].item() for i in range(2)]
        assert "blk.0.ffn_gate.weight" not in file.tensors and "rope_freqs.weight" in file.tensors
    else:
        m = file.metadata
        assert (m["mistral3.rope.scaling.type"], m["mistral3.rope.scaling.factor"],
                m["mistral3.rope.scaling.original_context_length"], m["mistral3.rope.scaling.yarn_log_multiplier"],
                m["mistral3.attention.temperature_scale"]) == ("yarn", 8.0, 8, 1.0, 0.5)
    _rewrite(tmp_path / "m.gguf", tmp_path / "plain.gguf", drop=[k for k in file.metadata if k.startswith("handformer.")])
    run = load_lm(run_dir)
    ids = run.tokenizer.encode(TEXT[:60])
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        expected = reference(torch.tensor([ids, ids[::-1]])).logits
    for name in ("m", "plain"):
        assert main(["import-gguf", str(tmp_path / f"{name}.gguf"), str(tmp_path / name)]) == 0
        back = load_lm(tmp_path / name)
        assert back.model.cfg.rope_scaling == run.model.cfg.rope_scaling and back.model.cfg.family == run.model.cfg.family
        torch.testing.assert_close(_logits(back, ids), expected, atol=1e-5, rtol=1e-5)
    _same_run(run_dir, tmp_path / "m")
