"""llama.cpp runs handformer's GGUF exports: llama-cpp-python 0.3.36 (which fixes llama.cpp's commit),
fed token ids, generates greedily the same tokens as `handformer generate` for a model trained here
on tiny Shakespeare, for imported Hugging Face models of every family (Llama with Llama 3 scaling,
Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral, Gemma, Gemma 2 and Gemma 3 with sliding and global
layers, OLMo 2, SmolLM3, Phi-3, GPT-2; Qwen3's, Qwen3-MoE's and the Gemmas' with head and expert
widths, soft-caps and query scales other than the ones transformers' GGUF loader assumes, which
llama.cpp reads from the file) and for llama2.c's stories260K; and its tokenizer gives handformer's
ids for a fixture text (characters, byte-level BPE, stories260K's SentencePiece).

Slow: llama-cpp-python builds from source (about 4 minutes on 2 cores), so it is not installed by
scripts/install.sh. Run with
    CMAKE_ARGS="-DGGML_BLAS=OFF -DLLAVA_BUILD=OFF" pip install llama-cpp-python==0.3.36
    python3 -m pytest -m slow tests/test_gguf_llamacpp.py
llama.cpp runs with a float32 KV cache (its default is float16) so that greedy choices are not
flipped by rounding the cache.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import dataset_file, require_module

from handformer.cli import main
from handformer.data.tokenizer import Tokenizer
from handformer.generation.generate import generate
from handformer.tasks.lm.run import load_lm

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread", "llama_cpp")]
transformers = require_module("transformers", "pip install -e '.[dev]'")
LLAMA_CPP = None  # the module, imported by the fixture: only when these (slow) tests are selected


@pytest.fixture(scope="module")
def llama_cpp():
    """llama-cpp-python, or a skip (a failure under HANDFORMER_REQUIRE_REFERENCES=1) saying how to
    install it. Imported here, not at collection, so that the default run (-m 'not slow') does
    not need it."""
    global LLAMA_CPP
    LLAMA_CPP = require_module("llama_cpp", 'CMAKE_ARGS="-DGGML_BLAS=OFF -DLLAVA_BUILD=OFF" pip install '
                                            "llama-cpp-python==0.3.36 (a source build, about 4 minutes)")
    return LLAMA_CPP

ROOT = Path(__file__).resolve().parents[1]
F32 = 0  # GGML_TYPE_F32, for llama.cpp's KV cache
NEW_TOKENS = 48


def _llama_cpp(path, n_ctx):
    return LLAMA_CPP.Llama(str(path), n_ctx=n_ctx, n_threads=1, verbose=False, type_k=F32, type_v=F32)


def _llama_cpp_greedy(path, ids, n, stops, n_ctx):
    """llama.cpp's own sampling loop at temperature 0 (top-k 1), stopped as handformer stops."""
    llm = _llama_cpp(path, n_ctx)
    out = []
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        out.append(int(token))
        if token in stops or len(out) == n:
            break
    llm.close()
    return out


def _same_greedy(run_dir, gguf_path, prompt, n=NEW_TOKENS, n_ctx=None):
    run = load_lm(run_dir)
    ids = ([run.tokens.bos_id] if run.tokens.bos_id is not None else []) + run.tokenizer.encode(prompt)
    n = min(n, run.model.cfg.max_positions - len(ids))
    expected = generate(run.model, [ids], n, temperature=0, stop_tokens=run.tokens.eos_ids)[0]
    got = _llama_cpp_greedy(gguf_path, ids, n, set(run.tokens.eos_ids), n_ctx or run.model.cfg.max_positions)
    assert got == expected, (run.tokenizer.decode(got), run.tokenizer.decode(expected))
    return expected


def _same_tokens(gguf_path, tokenizer, text):
    llm = _llama_cpp(gguf_path, 64)
    got = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    llm.close()
    assert got == tokenizer.encode(text)


def _train(out, config, *pairs):
    sets = ["train.progress=false", "train.device=cpu", "train.eval_every=100", *pairs]
    assert main(["train", "--config", str(ROOT / "configs" / config), "--out", str(out),
                 *[a for p in sets for a in ("--set", p)]]) == 0


@pytest.mark.parametrize("config, pairs", [
    ("shakespeare_char_modern.toml", []),
    ("shakespeare_char.toml", ["model.activation=gelu_tanh"]),  # llama.cpp's GPT-2 has the tanh GELU
], ids=["llama", "gpt2"])
def test_a_model_trained_here_on_shakespeare_generates_the_same_in_llama_cpp(config, pairs, tmp_path, capsys):
    shakespeare = dataset_file("tinyshakespeare", "input.txt")
    _train(tmp_path / "run", config, "train.steps=300", *pairs)
    assert main(["export-gguf", str(tmp_path / "run"), str(tmp_path / "m.gguf")]) == 0
    capsys.readouterr()
    tokens = _same_greedy(tmp_path / "run", tmp_path / "m.gguf", "ROMEO:\n")
    assert len(set(tokens)) > 3  # a trained model's text, not one repeated token
    run = load_lm(tmp_path / "run")
    _same_tokens(tmp_path / "m.gguf", run.tokenizer, shakespeare.read_text()[:2000])
    assert main(["generate", str(tmp_path / "run"), "--prompt", "ROMEO:\n", "--temperature", "0",
                 "--max-new-tokens", str(len(tokens))]) == 0
    text = run.tokenizer.decode(tokens)
    assert capsys.readouterr().out.rstrip("\n") == "ROMEO:\n" + text
    # llama.cpp from text, as docs/gguf.md shows it: its tokenizer, its sampler at temperature 0, its
    # default (float16) KV cache
    llm = LLAMA_CPP.Llama(str(tmp_path / "m.gguf"), n_ctx=64, verbose=False)
    out = llm("ROMEO:\n", max_tokens=len(tokens), temperature=0)
    assert out["choices"][0]["text"] == text


SIZE = dict(vocab_size=40, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
            num_hidden_layers=2, max_position_embeddings=96, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ROPE = {"rope_type": "default", "rope_theta": 1e4}
HF = {
    "llama3": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZE, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        **SIZE, sliding_window=None, rope_parameters=ROPE)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SIZE, tie_word_embeddings=True, use_sliding_window=False, rope_parameters={**ROPE, "rope_theta": 1e6})),
    "gemma": lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(
        **{**SIZE, "num_key_value_heads": 1}, head_dim=32, hidden_act="gelu_pytorch_tanh", rope_parameters=ROPE)),
    "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZE, tie_word_embeddings=False, rope_parameters=ROPE)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=40, n_embd=64, n_head=4, n_layer=2, n_positions=96, bos_token_id=1, eos_token_id=2)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(  # heads 24 wide, not 64 / 4
        **SIZE, head_dim=24, tie_word_embeddings=True, rope_parameters={**ROPE, "rope_theta": 1e6})),
    "qwen3_moe": lambda: transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(  # experts 48 wide
        **SIZE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True,
        rope_parameters=ROPE)),
    "mixtral": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(  # llama.cpp's Llama + experts
        **SIZE, num_local_experts=4, num_experts_per_tok=2, rope_parameters=ROPE)),
    "olmo2": lambda: transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**SIZE, rope_parameters=ROPE)),
    "smollm3": lambda: transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(  # layers 3 and 7 without RoPE
        **{**SIZE, "num_hidden_layers": 8}, rope_parameters={**ROPE, "rope_theta": 2e6})),
    # windows of 5: the 32 generated tokens run 6 windows past them
    "gemma2": lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(  # layer 1 of 3 global
        **{**SIZE, "num_hidden_layers": 3}, head_dim=32, sliding_window=5, query_pre_attn_scalar=32,
        attn_logit_softcapping=20.0, final_logit_softcapping=10.0, rope_parameters=ROPE)),
    "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(  # layer 5 of 7 global
        **{**SIZE, "num_hidden_layers": 7, "num_key_value_heads": 1}, head_dim=32, sliding_window=5,
        sliding_window_pattern=6, query_pre_attn_scalar=32,
        rope_parameters={"sliding_attention": ROPE, "full_attention": {**ROPE, "rope_theta": 1e6}})),
}
TEXT = "to be or not to be, that is the question: whether 'tis nobler in the mind to suffer\n"


def _import_and_export(hf_model, tmp_path: Path, gguf_name: str):
    """hf_model's weights moved off their initial values, saved with a character tokenizer to
    tmp_path/hf, imported (tmp_path/run) and exported to tmp_path/gguf_name; hf_model back."""
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf_model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    Tokenizer.train_char([TEXT]).save(tmp_path / "hf" / "tokenizer.json")
    assert main(["import-hf", str(tmp_path / "hf"), str(tmp_path / "run")]) == 0
    assert main(["export-gguf", str(tmp_path / "run"), str(tmp_path / gguf_name)]) == 0
    return hf_model


@pytest.mark.parametrize("family", list(HF))
def test_an_imported_model_generates_the_same_in_llama_cpp(family, tmp_path):
    torch.manual_seed(sorted(HF).index(family))
    _import_and_export(HF[family](), tmp_path, "m.gguf")
    _same_greedy(tmp_path / "run", tmp_path / "m.gguf", "to be or", n=32)


def _phi4_mini(original, max_positions):
    # RoPE on 12 of each head's 16 dims, LongRoPE with 6 factors a set, tied
    rope = {"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.1 * i for i in range(6)], "long_factor": [1.5 + 0.7 * i for i in range(6)]}
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **{**SIZE, "max_position_embeddings": max_positions}, tie_word_embeddings=True,
        original_max_position_embeddings=original, partial_rotary_factor=0.75, rope_parameters=rope))


@pytest.mark.parametrize("factors", ["short", "long"])
def test_phi4_minis_partial_rope_and_longrope_generate_the_same_in_llama_cpp(factors, tmp_path):
    """llama.cpp picks LongRoPE's factors by its context (rounded up to 256 positions), handformer by
    the sequence: short factors with an original context of 256 and llama.cpp's context 256; long
    ones with an original context of 16 and a prompt past it, so every generated token has them."""
    torch.manual_seed(7)
    _import_and_export(_phi4_mini(256, 512) if factors == "short" else _phi4_mini(16, 96), tmp_path, "m.gguf")
    prompt = "to be or" if factors == "short" else TEXT[:24]
    _same_greedy(tmp_path / "run", tmp_path / "m.gguf", prompt, n=32, n_ctx=256 if factors == "short" else None)


def test_stories260k_generates_and_tokenizes_the_same_in_llama_cpp(tmp_path):
    stories = dataset_file("stories260K")
    assert main(["import-llama2c", str(stories / "stories260K.bin"), str(stories / "tok512.bin"),
                 str(tmp_path / "run")]) == 0
    assert main(["export-gguf", str(tmp_path / "run"), str(tmp_path / "s.gguf")]) == 0
    tokens = _same_greedy(tmp_path / "run", tmp_path / "s.gguf", "Once upon a time", n=200)
    run = load_lm(tmp_path / "run")
    assert run.tokenizer.decode(tokens).startswith(", there was a little girl")
    _same_tokens(tmp_path / "s.gguf", run.tokenizer, "Once upon a time, there was a little girl named Lily. "
                 "She loved to play outside in the park. One day, she saw a big, red ball.\nDéjà vu, 123!")


def test_a_trained_bpe_tokenizer_tokenizes_the_same_in_llama_cpp(tmp_path):
    text = dataset_file("tinyshakespeare", "input.txt").read_text()
    _train(tmp_path / "run", "shakespeare_char_modern.toml", "train.steps=2", "data.tokenizer=bpe",
           "data.vocab_size=400")
    assert main(["export-gguf", str(tmp_path / "run"), str(tmp_path / "m.gguf")]) == 0
    _same_tokens(tmp_path / "m.gguf", load_lm(tmp_path / "run").tokenizer, text[:3000] + " 12345 naïve  \n\n x")


@pytest.mark.parametrize("page", ["docs/gguf.md", "docs/zh/gguf.md"])
def test_the_docs_llama_cpp_snippet_prints_what_handformer_generates(page, tmp_path, monkeypatch, capsys):
    """The `# needs: llama.cpp` python block of the page, run as written in a folder holding
    shakespeare.gguf: llama.cpp's text equals `handformer generate`'s."""
    import contextlib
    import io
    import re

    dataset_file("tinyshakespeare", "input.txt")
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(encoding="utf-8"), re.S)
               if b.startswith("# needs: llama.cpp")]
    _train(tmp_path / "run", "shakespeare_char_modern.toml", "train.steps=300")
    assert main(["export-gguf", str(tmp_path / "run"), str(tmp_path / "shakespeare.gguf")]) == 0
    capsys.readouterr()  # training's and export's lines
    assert main(["generate", str(tmp_path / "run"), "--prompt", "ROMEO:\n", "--temperature", "0",
                 "--max-new-tokens", "50"]) == 0
    expected = capsys.readouterr().out.rstrip("\n").removeprefix("ROMEO:\n")
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, page, "exec"), {"__name__": "docs"})
    assert printed.getvalue().rstrip("\n") == expected


# --- gpt-oss: export-gguf and llama.cpp's own converter ---------------------------------------------
# llama.cpp's sources (convert_hf_to_gguf.py and its gguf-py), as llama-cpp-python's source package has them
LLAMA_CPP_SRC = Path(os.environ.get("HANDFORMER_LLAMA_CPP_SRC", "/tmp/x/llama_cpp_python-0.3.36/vendor/llama.cpp"))
# The converter names a BPE vocabulary's split by hashing a fixed text's ids; a vocabulary trained
# here has no name there, so its check answers the split named on the command line (the tensors and the
# other keys are the converter's own); "llama-as-gpt2" also writes a Llama-style vocabulary as GPT-2's
# (a character vocabulary has no SentencePiece model). Run in a subprocess, with the converter's gguf-py.
CONVERT = """import runpy, sys
src, pre, vocab = sys.argv[1:4]
sys.path[:0] = [src + "/gguf-py", src]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
if vocab == "llama-as-gpt2":
    from conversion.llama import LlamaModel
    LlamaModel.set_vocab = lambda self: self._set_vocab_gpt2()
sys.argv = [src + "/convert_hf_to_gguf.py", *sys.argv[4:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
GPT_OSS = dict(vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
               intermediate_size=32, num_hidden_layers=3, num_local_experts=3, num_experts_per_tok=2,
               max_position_embeddings=96, sliding_window=4, bos_token_id=1, eos_token_id=2,
               rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})


def _gpt_oss_checkpoints(out):
    """A tiny gpt-oss (odd sizes, 3 layers, a BPE vocabulary of 300) saved twice: dense, and with its
    experts as MXFP4 blocks and scales (config.json's quant_method mxfp4, as the released ones), whose
    dense twin (the values the codes stand for) is transformers' reference."""
    import json

    from safetensors.torch import save_file
    from test_gpt_oss import _by_the_definition

    torch.manual_seed(11)
    model = transformers.GptOssForCausalLM(transformers.GptOssConfig(**GPT_OSS, attn_implementation="eager"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    tokenizer = Tokenizer.train_bpe([TEXT * 40], 300)
    model.save_pretrained(out / "dense", safe_serialization=True)
    state, g = dict(model.state_dict()), torch.Generator().manual_seed(12)
    with torch.no_grad():
        for name, (rows, cols) in (("gate_up_proj", (64, 64)), ("down_proj", (64, 32))):  # (2F, D), (D, F)
            for i in range(3):
                key = f"model.layers.{i}.mlp.experts.{name}"
                codes = torch.randint(0, 256, (3, rows, cols // 32, 16), dtype=torch.uint8, generator=g)
                scales = torch.randint(121, 126, (3, rows, cols // 32), dtype=torch.uint8, generator=g)
                getattr(model.model.layers[i].mlp.experts, name).copy_(_by_the_definition(codes, scales).transpose(1, 2))
                del state[key]
                state[f"{key}_blocks"], state[f"{key}_scales"] = codes, scales
    model.save_pretrained(out / "twin", safe_serialization=True)
    (out / "mxfp4").mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, out / "mxfp4" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "twin" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out / "mxfp4" / "config.json").write_text(json.dumps(config))
    for name in ("dense", "twin", "mxfp4"):
        tokenizer.save(out / name / "tokenizer.json")
        (out / name / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def _convert(hf_dir, out, pre="gpt-2", vocab="own", *extra):
    """llama.cpp's convert_hf_to_gguf.py on a Hugging Face folder, to an f32 file (or a skip saying where
    its sources go)."""
    if not (LLAMA_CPP_SRC / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"llama.cpp's convert_hf_to_gguf.py is not at {LLAMA_CPP_SRC}: unpack llama-cpp-python "
                    "0.3.36's source package and set HANDFORMER_LLAMA_CPP_SRC to its vendor/llama.cpp")
    done = subprocess.run([sys.executable, "-c", CONVERT, str(LLAMA_CPP_SRC), pre, vocab, str(hf_dir), "--outfile",
                           str(out), "--outtype", "f32", *extra], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("kind", ["dense", "mxfp4"])
def test_gpt_oss_as_llama_cpps_converter_writes_it_and_llama_cpp_generates_the_same(kind, tmp_path, capsys):
    """The same tiny gpt-oss through export-gguf (after import-hf) and through llama.cpp's
    convert_hf_to_gguf.py: the same tensors (names, shapes, float32 values: the MXFP4 experts decoded),
    the same model keys (the tokenizer's aside) but handformer's own and the converter's general.*
    ones, with equal values; import-gguf of the converter's file gives transformers' logits (1e-5);
    llama.cpp generates greedily what handformer generates from both dense files and from the MXFP4
    run's f32 export; on the converter's MXFP4 file its logits are handformer's with the experts'
    inputs rounded to Q8_0 (1e-4), as ggml multiplies MXFP4 blocks."""
    from handformer.convert.gguf_file import read_gguf

    _gpt_oss_checkpoints(tmp_path)
    assert main(["import-hf", str(tmp_path / kind), str(tmp_path / "run")]) == 0
    assert main(["export-gguf", str(tmp_path / "run"), str(tmp_path / "ours.gguf")]) == 0
    _convert(tmp_path / kind, tmp_path / "theirs.gguf")
    ours, theirs = read_gguf(tmp_path / "ours.gguf"), read_gguf(tmp_path / "theirs.gguf")
    model_keys = [{k for k in file.metadata if not k.startswith("tokenizer.")} for file in (ours, theirs)]
    assert model_keys[1] - model_keys[0] == {"general.quantization_version", "general.size_label", "general.type"}
    assert {k for k in model_keys[0] - model_keys[1] if not k.startswith("handformer.")} == {
        "gpt-oss.rope.dimension_count", "gpt-oss.vocab_size"}
    same = {k for k in set(ours.metadata) & set(theirs.metadata) if not k.startswith(("tokenizer.", "general."))}
    assert {k: ours.metadata[k] for k in same} == {k: theirs.metadata[k] for k in same}
    assert {n: t.shape for n, t in ours.tensors.items()} == {n: t.shape for n, t in theirs.tensors.items()}
    experts = {n for n, t in theirs.tensors.items() if t.type_name == "MXFP4"}
    assert len(experts) == (9 if kind == "mxfp4" else 0)
    for name in ours.tensors:
        assert torch.equal(ours.tensors[name].to_torch(), theirs.tensors[name].to_torch()), name
    assert main(["import-gguf", str(tmp_path / "theirs.gguf"), str(tmp_path / "back")]) == 0
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / ("twin" if kind == "mxfp4" else kind),
                                                                 dtype=torch.float32).eval()
    ids = torch.randint(3, 300, (2, 24), generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        torch.testing.assert_close(load_lm(tmp_path / "back").model(ids).logits, hf_model(ids).logits,
                                   atol=1e-5, rtol=1e-5)
    capsys.readouterr()
    _same_greedy(tmp_path / "run", tmp_path / "ours.gguf", "to be or", n=40)
    if kind == "dense":
        _same_greedy(tmp_path / "run", tmp_path / "theirs.gguf", "to be or", n=40)
    else:  # llama.cpp multiplies MXFP4 by activations rounded to Q8_0 (ggml's vec_dot_type): so does this
        run = load_lm(tmp_path / "run")
        ids = [1, *run.tokenizer.encode(TEXT[:40])]
        llm = LLAMA_CPP.Llama(str(tmp_path / "theirs.gguf"), n_ctx=96, n_threads=1, verbose=False, type_k=F32,
                              type_v=F32, logits_all=True)
        llm.eval(ids)
        theirs = torch.tensor(llm.scores[:len(ids)])
        llm.close()
        with torch.no_grad():
            exact = run.model(torch.tensor([ids])).logits[0]
            for expert in [e for layer in run.model.layers for e in layer.ffn.experts]:
                expert.forward = _q8_0_activations(expert)
            rounded = run.model(torch.tensor([ids])).logits[0]
        assert (theirs - exact).abs().max() > 0.05  # the rounding shows
        torch.testing.assert_close(theirs, rounded, atol=1e-4, rtol=1e-4)


def _q8_0_activations(expert):
    """gpt-oss's expert whose matrices see their input rounded to Q8_0, as ggml's MXFP4 product does."""
    from handformer.convert.gguf_quants import dequantize, quantize_q8_0

    def q8_0(x):
        return dequantize(quantize_q8_0(x).reshape(-1), "Q8_0", tuple(x.shape))

    def forward(x):
        x = q8_0(x)
        gate = expert.gate_proj(x).clamp(max=expert.limit)
        up = expert.up_proj(x).clamp(-expert.limit, expert.limit)
        return expert.down_proj(q8_0((up + 1) * gate * torch.sigmoid(expert.alpha * gate)))
    return forward
# Apertus (xIELU numbers in the metadata, q/k norms, Llama 3 scaling) and Ministral 3 (YaRN 8 over 8, queries
# scaled from positions 8, 16, 24, ...) at odd sizes: 6 heads of 16 over a width of 42
ODD = {**SIZE, "hidden_size": 42, "num_attention_heads": 6, "head_dim": 16, "intermediate_size": 46}
HF["apertus"] = lambda: transformers.ApertusForCausalLM(transformers.ApertusConfig(**ODD, rope_parameters={
    "rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64}))
HF["ministral3"] = lambda: transformers.Ministral3ForCausalLM(transformers.Ministral3Config(
    **ODD, sliding_window=None, rope_parameters={
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0, "original_max_position_embeddings": 8, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5}))
@pytest.mark.parametrize("family", ["apertus", "ministral3"])
def test_apertus_and_ministral3_as_llama_cpps_converter_writes_them(family, tmp_path):
    """llama.cpp's convert_hf_to_gguf.py and export-gguf write the same keys with the same values and
    the same tensors (rope_freqs to a float32 rounding: the converter blends in float32); import-gguf
    reads the converter's file with transformers' logits."""
    from handformer.convert.gguf_file import read_gguf

    torch.manual_seed(sorted(HF).index(family))
    hf_model = _import_and_export(HF[family]().eval(), tmp_path, "ours.gguf")
    _convert(tmp_path / "hf", tmp_path / "theirs.gguf", "gpt-2", "llama-as-gpt2")
    ours, theirs = read_gguf(tmp_path / "ours.gguf"), read_gguf(tmp_path / "theirs.gguf")
    keys = lambda f: {k: v for k, v in f.metadata.items()  # noqa: E731
                      if not k.startswith(("tokenizer.", "general.", "handformer."))}
    assert keys(ours) == keys(theirs)
    assert set(ours.tensors) == set(theirs.tensors)
    for name in ours.tensors:
        a, b = ours.tensors[name].to_torch(), theirs.tensors[name].to_torch()
        assert torch.equal(a, b) if name != "rope_freqs.weight" else torch.allclose(a, b, rtol=2e-7, atol=0), name
    assert main(["import-gguf", str(tmp_path / "theirs.gguf"), str(tmp_path / "back")]) == 0
    ids = list(range(3, 40)) + list(range(5, 25))  # 57 positions: 7 times the original context
    with torch.no_grad():
        expected = hf_model(torch.tensor([ids])).logits
        got = load_lm(tmp_path / "back").model(torch.tensor([ids])).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["apertus", "ministral3"])
def test_apertus_and_ministral3_generate_the_same_in_llama_cpp(family, tmp_path):
    """32 tokens after "to be or": Ministral 3's run past positions 8, 16, 24 and 32."""
    test_an_imported_model_generates_the_same_in_llama_cpp(family, tmp_path)


def test_deepseek_v3_generates_the_same_in_llama_cpp_and_as_its_converter_writes_it(tmp_path):
    """The tiny DeepSeek-V3 (with the released YaRN, mscale = mscale_all_dim) exported: llama.cpp's
    greedy tokens are handformer's; llama.cpp's convert_hf_to_gguf.py on the same checkpoint writes
    the same model keys and the same tensors bit for bit, and import-gguf reads its file to
    transformers' logits."""

    from helpers import randomize_hf
    from test_deepseek import released_yarn, save_hf
    from test_hf_families import _deepseek_v3

    from handformer.convert.gguf_file import read_gguf

    torch.manual_seed(11)
    hf_model = released_yarn(randomize_hf(_deepseek_v3(), 0.15))
    save_hf(hf_model, tmp_path / "hf")
    assert main(["import-hf", str(tmp_path / "hf"), str(tmp_path / "run")]) == 0
    assert main(["export-gguf", str(tmp_path / "run"), str(tmp_path / "m.gguf")]) == 0
    _same_greedy(tmp_path / "run", tmp_path / "m.gguf", "to be or", n=40)
    _convert(tmp_path / "hf", tmp_path / "c.gguf")
    ours, theirs = read_gguf(tmp_path / "m.gguf"), read_gguf(tmp_path / "c.gguf")
    model_keys = lambda f: {k: v for k, v in f.metadata.items() if k.startswith("deepseek2.")}  # noqa: E731
    assert model_keys(ours) == model_keys(theirs)
    assert set(ours.tensors) == set(theirs.tensors)
    for name, tensor in ours.tensors.items():
        assert torch.equal(tensor.to_torch(), theirs.tensors[name].to_torch()), name
    assert main(["import-gguf", str(tmp_path / "c.gguf"), str(tmp_path / "back")]) == 0
    ids = torch.randint(3, 101, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(load_lm(tmp_path / "back").model(ids).logits, hf_model(ids).logits,
                                   atol=1e-5, rtol=1e-5)


def test_qwen3_5_goes_to_gguf_as_llama_cpps_converter_writes_it_and_generates_the_same(tmp_path):
    """A tiny Qwen3.5 (2 key heads, 6 value heads: tiled in llama.cpp): export-gguf writes the tensors
    convert_hf_to_gguf.py writes, bit for bit, and its keys (but the interval it writes from the
    config's default); import-gguf reads the converter's file to transformers' logits; llama.cpp
    generates handformer's greedy tokens from both files, the recurrent states included."""

    import gguf

    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(
        vocab_size=320, hidden_size=42, intermediate_size=38, num_hidden_layers=4, num_attention_heads=3,
        num_key_value_heads=1, head_dim=24, max_position_embeddings=96, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=6, linear_value_head_dim=6,
        linear_conv_kernel_dim=3, layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25,
                         "mrope_section": [1, 1, 1], "mrope_interleaved": True}))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_((1 if "norm" in name and "linear_attn" in name else 0) + 0.15 * torch.randn_like(p))
    hf.eval().save_pretrained(tmp_path / "hf", safe_serialization=True)
    Tokenizer.train_bpe([TEXT * 20], 300).save(tmp_path / "hf" / "tokenizer.json")  # the converter needs merges
    _convert(tmp_path / "hf", tmp_path / "conv.gguf", "qwen2", "own", "--no-mtp")
    assert main(["import-hf", str(tmp_path / "hf"), str(tmp_path / "run")]) == 0
    assert main(["export-gguf", str(tmp_path / "run"), str(tmp_path / "ours.gguf")]) == 0
    ours, theirs = (gguf.GGUFReader(tmp_path / f) for f in ("ours.gguf", "conv.gguf"))
    keys = [{k for k in r.fields if k.startswith("qwen35.")} for r in (ours, theirs)]
    assert keys[0] - keys[1] == {"qwen35.vocab_size"} and keys[1] - keys[0] == {"qwen35.full_attention_interval"}
    for k in keys[0] & keys[1]:
        assert ours.fields[k].contents() == theirs.fields[k].contents(), k
    tensors = [{t.name: torch.from_numpy(t.data.copy()) for t in r.tensors} for r in (ours, theirs)]
    assert tensors[0].keys() == tensors[1].keys()
    assert all(torch.equal(tensors[0][n], tensors[1][n]) for n in tensors[0])
    assert main(["import-gguf", str(tmp_path / "conv.gguf"), str(tmp_path / "back")]) == 0
    ids = torch.randint(3, 300, (2, 70), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(load_lm(tmp_path / "back").model(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)
    for name in ("ours.gguf", "conv.gguf"):
        tokens = _same_greedy(tmp_path / "run", tmp_path / name, TEXT[:30], n=60)
        assert len(set(tokens)) > 10
