"""`handformer import-llama2c`: karpathy's stories260K (a real trained Llama, llama2.c's legacy
format) and its tok512 tokenizer, checked against two references that share no code with handformer:

- llama2.c's own run.c (karpathy/llama2.c at 350e04f, built with `gcc -O2 -o run run.c -lm` outside
  this project). The texts below are what it printed for
  `./run stories260K.bin -z tok512.bin -t 0 -n 256` (and `-i "Once upon a time"`: the same text) and
  `-t 0 -n 512 -i "The dog"` (the story ends with BOS, where run.c stops). The token ids are what
  run.c's `encode(tokenizer, text, 1, 0, ...)` returns (a 10-line C harness that includes run.c
  with -DTESTING and prints them).
- transformers' LlamaForCausalLM, given the same weights converted to Hugging Face's layout here,
  from the raw file, as Hugging Face's own Llama conversion permutes q/k.

The checkpoint is not ours and is never committed: it is found by the data lookup
(`handformer data get stories260K`, $HANDFORMER_DATA, or ../shared/data beside the clone).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
import transformers
from helpers import dataset_file

from handformer.cli import main
from handformer.convert.llama2c_tokenizer import llama2c_tokenizer
from handformer.convert.llama2c_weights import read_header
from handformer.generation.generate import generate
from handformer.tasks.lm.imports import import_llama2c
from handformer.tasks.lm.run import load_lm

DATA = dataset_file("stories260K")  # a failure in CI (HANDFORMER_REQUIRE_REFERENCES), else a skip
MODEL, TOKENIZER = DATA / "stories260K.bin", DATA / "tok512.bin"
pytestmark = pytest.mark.usefixtures("one_thread")

RUN_C_STORY = (
    'Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, '
    'she saw a big, red ball. She wanted to play with it, but it was too high.\nLily\'s mom said, "Lily, '
    'let\'s go to the park." Lily was sad and didn\'t know what to do. She said, "I want to play with your '
    'ball, but I can\'t find it."\nLily was sad and didn\'t know what to do. She said, "I\'m sorry, Lily. I '
    'didn\'t know what to do."\nLily didn\'t want to help her mom, so she said, "I\'m sorry, mom. I didn\'t '
    'know what to do." Her mom said, "Don\'t worry, Lily. We can help you.')
RUN_C_DOG = (
    'The dog was a big, red ball. He liked to play with his ball. He liked to play with his ball. He liked '
    'to play with his ball. He liked to play with his ball.\nOne day, a little boy named Tim came to the '
    'ball. He saw a big ball. The ball was very small. Tim wanted to play with the ball. He wanted to play '
    'with the ball.\nTim said, "I want to play with the ball. I will find it." The ball was happy. Tim and '
    'the ball played with the ball. They played together. They had a lot of fun. Tim and the ball played '
    'together. They had a lot of fun.')
# text -> run.c's encode(text, bos=1): dummy prefix, byte fallback (é, ☃, 日本), greedy merges by score
RUN_C_IDS = {
    "Once upon a time": [1, 403, 407, 261, 378],
    "": [1],
    "Hello  world": [1, 346, 306, 414, 410, 263, 304, 341],
    'Lily\'s mom said, "No!"': [1, 317, 439, 419, 357, 336, 432, 313, 458, 414, 443, 436],
    "héllo wörld ☃ 日本": [1, 270, 485, 306, 414, 263, 198, 185, 420, 341, 410, 229, 155, 134, 410, 233,
                           154, 168, 233, 159, 175],
    "  leading spaces": [1, 410, 410, 278, 411, 380, 299, 262, 427, 412, 331, 419],
    "tab\tand\nnewline": [1, 259, 412, 430, 12, 412, 264, 13, 416, 411, 424, 421, 271, 411],
    "The cat sat on the mat. It was happy.": [1, 291, 280, 294, 262, 294, 353, 265, 284, 294, 426, 359,
                                              413, 286, 393, 426],
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama2c") / "stories260K"
    assert main(["import-llama2c", str(MODEL), str(TOKENIZER), str(path)]) == 0
    return path


def test_tokenizer_encodes_and_decodes_as_run_c():
    tok = llama2c_tokenizer(TOKENIZER, 512)
    for text, ids in RUN_C_IDS.items():
        assert [1] + tok.encode(text) == ids, text
        assert tok.decode(ids) == text  # BOS dropped, byte tokens back to UTF-8, dummy space stripped


def test_greedy_story_equals_run_c(run_dir):
    run = load_lm(run_dir)
    assert run.tokens.bos_id == 1 and run.tokens.eos_ids == [2, 1]
    new = generate(run.model, [[1]], 256, temperature=0, stop_tokens=run.tokens.eos_ids)[0]
    assert len(new) == 256 and run.tokenizer.decode([1] + new) == RUN_C_STORY


def test_cli_generate_tells_run_c_stories(run_dir, capsys):
    # run.c's -n 256 counts the prompt's 5 positions: 252 new tokens.
    assert main(["generate", str(run_dir), "--prompt", "Once upon a time", "--max-new-tokens", "252",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == RUN_C_STORY + "\n"
    # This story ends with BOS: generation stops there, as run.c's does (400 would be allowed).
    assert main(["generate", str(run_dir), "--prompt", "The dog", "--max-new-tokens", "400",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == RUN_C_DOG + "\n"


# --- transformers on the same weights ----------------------------------------------------------

def _raw_legacy(path):
    """The legacy file as llama2.c's export.py wrote it: header ints and named fp32 arrays."""
    data = path.read_bytes()
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", data)
    floats = np.frombuffer(data, dtype="<f4", offset=28)
    hd, kv_dim = dim // n_heads, dim // n_heads * n_kv
    sizes = [("emb", (abs(vocab), dim)), ("rms_att", (n_layers, dim)), ("wq", (n_layers, dim, dim)),
             ("wk", (n_layers, kv_dim, dim)), ("wv", (n_layers, kv_dim, dim)), ("wo", (n_layers, dim, dim)),
             ("rms_ffn", (n_layers, dim)), ("w1", (n_layers, hidden, dim)), ("w2", (n_layers, dim, hidden)),
             ("w3", (n_layers, hidden, dim)), ("rms_final", (dim,)), ("cos", (seq_len, hd // 2)),
             ("sin", (seq_len, hd // 2))]
    if vocab < 0:
        sizes.append(("wcls", (-vocab, dim)))
    arrays, start = {}, 0
    for name, shape in sizes:
        n = int(np.prod(shape))
        arrays[name] = torch.tensor(floats[start:start + n].reshape(shape))
        start += n
    assert start == len(floats)
    return (dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len), arrays


def _hf_llama(header, a):
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = header
    cfg = transformers.LlamaConfig(vocab_size=abs(vocab), hidden_size=dim, intermediate_size=hidden,
                                   num_hidden_layers=n_layers, num_attention_heads=n_heads,
                                   num_key_value_heads=n_kv, max_position_embeddings=seq_len,
                                   rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=vocab > 0)
    model = transformers.LlamaForCausalLM(cfg).eval()

    def permute(w, heads):  # Meta's interleaved RoPE rows -> HF's rotate_half layout
        return w.view(heads, w.size(0) // heads // 2, 2, w.size(1)).transpose(1, 2).reshape(w.shape)

    state = {"model.embed_tokens.weight": a["emb"], "model.norm.weight": a["rms_final"],
             "lm_head.weight": a["wcls"] if vocab < 0 else a["emb"]}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        state.update({p + "input_layernorm.weight": a["rms_att"][i],
                      p + "post_attention_layernorm.weight": a["rms_ffn"][i],
                      p + "self_attn.q_proj.weight": permute(a["wq"][i], n_heads),
                      p + "self_attn.k_proj.weight": permute(a["wk"][i], n_kv),
                      p + "self_attn.v_proj.weight": a["wv"][i], p + "self_attn.o_proj.weight": a["wo"][i],
                      p + "mlp.gate_proj.weight": a["w1"][i], p + "mlp.down_proj.weight": a["w2"][i],
                      p + "mlp.up_proj.weight": a["w3"][i]})
    model.load_state_dict(state, strict=True)
    return model


def _ids(n=96):
    return torch.randint(3, 512, (2, n), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def test_logits_equal_transformers_llama(run_dir):
    header, arrays = _raw_legacy(MODEL)
    hf = _hf_llama(header, arrays)
    ids = _ids()
    expected = hf(ids).logits
    assert expected.std() > 1.0
    torch.testing.assert_close(load_lm(run_dir).model(ids).logits, expected, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_export_hf_gives_transformers_the_same_model_tokens_and_stops(run_dir, tmp_path, capsys):
    """stories260K -> export-hf -> transformers: LlamaForCausalLM with the logits of the model built
    here from the raw file, run.c's story greedily, prompts encoded with BOS by
    PreTrainedTokenizerFast, and generation stopping at EOS and BOS (run.c's stop tokens)."""
    out = tmp_path / "hf"
    assert main(["export-hf", str(run_dir), str(out)]) == 0
    assert "exported LlamaForCausalLM (llama)" in capsys.readouterr().out
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = _ids()
    expected = _hf_llama(*_raw_legacy(MODEL))(ids).logits
    torch.testing.assert_close(hf(ids).logits, expected, atol=1e-5, rtol=1e-5)
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(out)
    for text, run_c_ids in RUN_C_IDS.items():
        assert tok(text)["input_ids"] == run_c_ids, text
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert hf.generation_config.eos_token_id == [2, 1] and hf.generation_config.bos_token_id == 1
    prompt = tok("Once upon a time", return_tensors="pt")["input_ids"]
    story = hf.generate(prompt, do_sample=False, max_new_tokens=252)[0]
    assert tok.decode(story, skip_special_tokens=True) == RUN_C_STORY
    dog = hf.generate(tok("The dog", return_tensors="pt")["input_ids"], do_sample=False, max_new_tokens=400)[0]
    assert dog[-1] == 1 and tok.decode(dog[:-1], skip_special_tokens=True) == RUN_C_DOG  # stopped at BOS


def _write_legacy(path, header, a, separate):
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = header
    order = ["emb", "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3", "rms_final", "cos", "sin"]
    body = [a[k] for k in order] + ([a["wcls"]] if separate else [])
    head = struct.pack("<7i", dim, hidden, n_layers, n_heads, n_kv, -vocab if separate else vocab, seq_len)
    path.write_bytes(head + b"".join(t.numpy().astype("<f4").tobytes() for t in body))


def _write_v1(path, header, a, separate):
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = header
    head = struct.pack("<Ii7iB", 0x616B3432, 1, dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len,
                       int(not separate))
    order = ["rms_att", "rms_ffn", "rms_final", "emb", "wq", "wk", "wv", "wo", "w1", "w2", "w3"]
    body = [a[k] for k in order] + ([a["wcls"]] if separate else [])
    path.write_bytes(head.ljust(256, b"\0") + b"".join(t.numpy().astype("<f4").tobytes() for t in body))


@torch.no_grad()
@pytest.mark.parametrize("version", ["legacy", "v1"])
@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate_classifier"])
def test_both_formats_and_classifiers_equal_transformers(version, separate, tmp_path, run_dir):
    header, arrays = _raw_legacy(MODEL)
    arrays["wcls"] = arrays["emb"] + 0.05 * torch.randn(arrays["emb"].shape, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "model.bin"
    (_write_legacy if version == "legacy" else _write_v1)(path, header, arrays, separate)
    assert read_header(path).shared_classifier is not separate
    result = import_llama2c(path, TOKENIZER, tmp_path / "run")
    assert result.n_parameters == 260_032 + (512 * 64 if separate else 0)
    hf = _hf_llama((*header[:5], -header[5] if separate else header[5], header[6]), arrays)
    ids = _ids(64)
    got = load_lm(tmp_path / "run").model(ids).logits
    torch.testing.assert_close(got, hf(ids).logits, atol=1e-5, rtol=1e-5)
    if not separate:  # the same weights in either format: the same model as the real file's
        torch.testing.assert_close(got, load_lm(run_dir).model(ids).logits, atol=0, rtol=0)


# --- bad files ---------------------------------------------------------------------------------

def _error(capsys, *args):
    assert main(["import-llama2c", *map(str, args)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_bad_files_are_one_clear_error_and_nothing_is_written(tmp_path, capsys):
    data, tok = MODEL.read_bytes(), TOKENIZER.read_bytes()
    bad = tmp_path / "bad.bin"
    run = tmp_path / "run"
    for cut in (0, 10, 28, 1000, len(data) - 1):
        bad.write_bytes(data[:cut])
        err = _error(capsys, bad, TOKENIZER, run)
        assert str(bad) in err and ("truncated" in err or "too short" in err), err
    bad.write_bytes(data + b"\0\0\0\0")
    assert "longer than its header says" in _error(capsys, bad, TOKENIZER, run)
    bad.write_bytes(struct.pack("<Ii", 0x616B3432, 2).ljust(256, b"\0"))
    assert "version 2 is not supported (int8-quantized" in _error(capsys, bad, TOKENIZER, run)
    bad.write_bytes(struct.pack("<7i", 64, 172, 5, 8, 0, 512, 512) + data[28:])
    assert "n_kv_heads=0" in _error(capsys, bad, TOKENIZER, run)
    bad.write_bytes(data[:28 + 4 * 100] + struct.pack("<f", float("nan")) + data[28 + 4 * 101:])
    assert "token_embedding hold NaN or infinite values" in _error(capsys, bad, TOKENIZER, run)
    assert "no llama2.c checkpoint at" in _error(capsys, tmp_path / "absent.bin", TOKENIZER, run)
    assert str(tmp_path) in _error(capsys, tmp_path, TOKENIZER, run)  # a directory

    for cut in (2, 100, len(tok) - 1):
        bad.write_bytes(tok[:cut])
        err = _error(capsys, MODEL, bad, run)
        assert str(bad) in err and ("truncated" in err or "too short" in err or "holds" in err), err
    bad.write_bytes(tok + tok[4:40])
    assert "do not belong together" in _error(capsys, MODEL, bad, run)
    bad.write_bytes(tok[:4] + struct.pack("<fi", 0.0, 3) + b"\xff\xfe\xfd" + tok[4 + 8 + 5:])
    assert "token 0 is not UTF-8" in _error(capsys, MODEL, bad, run)
    assert not run.exists()
