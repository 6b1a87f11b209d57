"""`handformer export-hf`: language-model runs -> Hugging Face directories that transformers loads.

Runs are built with random weights (norm gains and biases randomized too, so a swapped tensor
shows): GPT-2 style (tied, and without biases like the baby GPT), Llama style (GQA, untied), and
runs imported from tiny random Hugging Face models. Each export must load with
AutoModelForCausalLM and PreTrainedTokenizerFast, give handformer's logits and greedy tokens, and
import back to the same weights bit for bit.
"""

import json

import pytest
import torch
from helpers import require_module
from safetensors.torch import load_file

transformers = require_module("transformers", "pip install -e '.[dev]'")

from handformer.cli import main  # noqa: E402
from handformer.config import CausalLMConfig  # noqa: E402
from handformer.convert.hf_import import import_hf  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.tasks.lm.run import SpecialTokens, load_lm, save_lm_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = "to be or not to be, that is the question: whether 'tis nobler in the mind to suffer\n"
NEW_TOKENS = 8

PRESETS = {
    "gpt2_tied": lambda v: CausalLMConfig.gpt2_style(vocab_size=v, d_model=32, n_heads=4, d_ff=64,
                                                     n_layers=2, max_positions=48),
    "gpt2_nobias_gelu": lambda v: CausalLMConfig.gpt2_style(vocab_size=v, d_model=32, n_heads=4, d_ff=64,
                                                            n_layers=2, max_positions=48, bias=False,
                                                            activation="gelu"),
    "llama_gqa": lambda v: CausalLMConfig.llama_style(vocab_size=v, d_model=32, n_heads=4, n_kv_heads=2,
                                                      d_ff=48, n_layers=2, max_positions=48,
                                                      rope_theta=500.0),
}


def _randomize(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((1 if name.endswith("weight") else 0) + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    return model.eval()


def _run(tmp_path, preset, tokens=None):
    tok = Tokenizer.train_char([TEXT])
    torch.manual_seed(sorted(PRESETS).index(preset))
    model = _randomize(CausalLM(PRESETS[preset](tok.vocab_size)))
    save_lm_run(tmp_path / preset, model, tok, tokens or SpecialTokens())
    return tmp_path / preset


def _hf_greedy(hf_model, ids):
    out = hf_model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS,
                            min_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


def _check_equal(run_dir, hf_dir, prompt):
    run = load_lm(run_dir)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(hf_dir)
    ids = run.tokenizer.encode(prompt)
    assert hf_tok(prompt, add_special_tokens=False)["input_ids"] == ids
    batch = torch.tensor([ids, ids[::-1]])
    with torch.no_grad():
        expected = run.model(batch).logits
        assert expected.std() > 0.5  # far from trivial
        torch.testing.assert_close(hf_model(batch).logits, expected, atol=1e-5, rtol=1e-5)
        assert generate(run.model, [ids], NEW_TOKENS, temperature=0)[0] == _hf_greedy(hf_model, ids)
    return run, hf_model


@pytest.mark.parametrize("preset", list(PRESETS))
def test_export_loads_in_transformers_and_matches(preset, tmp_path, capsys):
    tokens = SpecialTokens(bos_id=None, eos_id=2, pad_id=0)
    run_dir = _run(tmp_path, preset, tokens)
    out = tmp_path / "hf"
    assert main(["export-hf", str(run_dir), str(out)]) == 0
    printed = capsys.readouterr().out
    arch = "LlamaForCausalLM" if preset.startswith("llama") else "GPT2LMHeadModel"
    assert f"exported {arch}" in printed
    assert ("bias=false" in printed) == (preset == "gpt2_nobias_gelu")
    _, hf_model = _check_equal(run_dir, out, "to be or not")
    assert type(hf_model).__name__ == arch
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.eos_token_id == 2 and hf_tok.pad_token_id == 0

    # Back again: the same run, weights bit for bit (biases of a bias-free run come back as zeros).
    back = tmp_path / "back"
    import_hf(out, back)
    original, returned = load_file(run_dir / "model.safetensors"), load_file(back / "model.safetensors")
    for key, tensor in original.items():
        assert torch.equal(returned[key], tensor), key
    extra = set(returned) - set(original)
    assert all(k.endswith("bias") and not returned[k].any() for k in extra)
    assert bool(extra) == (preset == "gpt2_nobias_gelu")
    assert load_lm(back).tokens == tokens


def test_imported_run_goes_back_to_its_architecture_bit_for_bit(tmp_path):
    """A tiny random Hugging Face Llama (GQA, untied) through import-hf and export-hf: the
    checkpoint's tensors come back unchanged, and transformers gives the same logits."""
    cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=32, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=48, num_hidden_layers=2,
                                   max_position_embeddings=48, tie_word_embeddings=False,
                                   bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    hf_model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    hf_model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    tok = Tokenizer.train_char([TEXT])
    tok.save(tmp_path / "hf" / "tokenizer.json")
    import_hf(tmp_path / "hf", tmp_path / "run")
    assert main(["export-hf", str(tmp_path / "run"), str(tmp_path / "again")]) == 0
    before, after = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    assert set(before) == set(after)
    for key in before:
        assert torch.equal(before[key], after[key]), key
    _check_equal(tmp_path / "run", tmp_path / "again", "not to be")


@pytest.mark.parametrize("change,message", [
    ({"norm_placement": "post"}, "norm_placement='post' (GPT-2 is pre-norm)"),
    ({"position": "sinusoidal"}, "position='sinusoidal' maps to no Hugging Face architecture"),
    ({"activation": "swiglu"}, "activation='swiglu' (GPT-2 supports"),
    ({"position": "rope", "activation": "gelu"}, "norm='layernorm' (Llama uses RMSNorm); activation='gelu'"),
    ({"scale_embeddings": True}, "scale_embeddings=True"),
    ({"head_dim": 16}, "head_dim=16 (GPT-2's heads are d_model / n_heads wide)"),
    ({"bias": False, "qkv_bias": True}, "qkv_bias=True with bias=False"),
    ({"sliding_window": 4}, "sliding_window=4 (sliding-window attention is Mistral's"),
    ({"position": "rope", "norm": "rmsnorm", "activation": "swiglu", "rope_scaling": {}},
     "rope_scaling is set (Llama 3.1 frequency scaling is not exported)"),
])
def test_settings_that_do_not_map_are_named(change, message, tmp_path, capsys):
    tok = Tokenizer.train_char([TEXT])
    cfg = CausalLMConfig.gpt2_style(vocab_size=tok.vocab_size, d_model=32, n_heads=4, d_ff=64,
                                    n_layers=1, max_positions=16, **change)
    save_lm_run(tmp_path / "run", CausalLM(cfg), tok, SpecialTokens())
    assert main(["export-hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "hf").exists()


def test_other_errors(tmp_path, capsys):
    run_dir = _run(tmp_path, "gpt2_tied")

    def fails(args, message):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1

    fails(["export-hf", str(tmp_path / "nope"), str(tmp_path / "hf")], "not a run directory")
    assert main(["export-hf", str(run_dir), str(tmp_path / "hf")]) == 0
    fails(["export-hf", str(run_dir), str(tmp_path / "hf")], "already holds a config.json")
    assert main(["export-hf", str(run_dir), str(tmp_path / "hf"), "--overwrite"]) == 0
    assert main(["quantize", str(run_dir), str(tmp_path / "q"), "--int8"]) == 0
    fails(["export-hf", str(tmp_path / "q"), str(tmp_path / "hf2")], "this run is quantized")
