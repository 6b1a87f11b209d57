"""`handformer import-hf`: Hugging Face checkpoint directories -> language-model run directories.

Tiny random GPT-2 and Llama models (GQA, tied and untied, single-file and sharded safetensors),
and one of each family in test_hf_families.py (Qwen2, Mistral, Gemma, Phi-3, SmolLM, Llama 3.x), are built from a config (no download) and saved with save_pretrained next to a small
tokenizer.json. After the import, the run must give Hugging Face's logits to 1e-5 and the same
greedy continuation token for token; broken directories must fail with an error naming the problem.
"""

import json
import shutil

import pytest
import torch
from helpers import randomize_hf, require_module
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers, processors

transformers = require_module("transformers", "pip install -e '.[dev]'")

from handformer.cli import main  # noqa: E402
from handformer.convert.hf_import import special_tokens  # noqa: E402
from handformer.data.special_tokens import SpecialTokens  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.tasks.lm.imports import import_hf  # noqa: E402
from handformer.tasks.lm.run import load_lm  # noqa: E402

VOCAB = 101
PROMPT_LEN, NEW_TOKENS = 10, 8


pytestmark = pytest.mark.usefixtures("one_thread")


def _tokenizer(tokens, bos=None):
    """A whitespace WordLevel tokenizer over `tokens` (id = position); `bos` is prepended by its
    post-processor, as Llama's tokenizer.json does."""
    hf = HFTokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=tokens[0]))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.add_special_tokens([t for t in tokens if t.startswith("<")])
    if bos is not None:
        hf.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                          special_tokens=[(bos, tokens.index(bos))])
    return hf


def _gpt2():
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    return transformers.GPT2LMHeadModel(cfg)


def _llama(tied, eos):
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=96, num_hidden_layers=2,
                                   max_position_embeddings=64, tie_word_embeddings=tied,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                                   bos_token_id=1, eos_token_id=eos)
    return transformers.LlamaForCausalLM(cfg)


def _family(name):
    """The tiny models of test_hf_families.py (config: bos 1, eos 2, pad 0)."""
    from test_hf_families import BUILDERS
    return BUILDERS[name]


LLAMA_TOKENS = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(3, VOCAB)]
# Today's families (test_hf_families.py's tiny models): imported, generated from the run directory
NEW_FAMILIES = ("qwen3", "qwen3_window", "gemma2", "gemma3", "gemma3_scaled", "smollm3", "olmo2", "phi4_mini",
                "mixtral", "qwen3_moe", "qwen2_moe", "olmoe")
GPT2_TOKENS = [f"w{i}" for i in range(VOCAB - 1)] + ["<|endoftext|>"]

# name -> (model builder, save_pretrained kwargs, tokenizer.json, tokenizer_config.json or None,
#          the SpecialTokens the run must record)
CASES = {
    # GPT-2: no BOS in prompts although config.json has a bos_token_id; EOS is <|endoftext|>.
    "gpt2": (_gpt2, {}, lambda: _tokenizer(GPT2_TOKENS), None,
             SpecialTokens(bos_id=None, eos_id=VOCAB - 1, pad_id=None)),
    # Llama 2 style: the tokenizer prepends <s> and tokenizer_config.json says add_bos_token.
    "llama_untied": (lambda: _llama(tied=False, eos=2), {}, lambda: _tokenizer(LLAMA_TOKENS, bos="<s>"),
                     {"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>"},
                     SpecialTokens(bos_id=1, eos_id=2, pad_id=None)),
    # Sharded, tied, several EOS ids (like Llama 3), BOS only from tokenizer_config.json.
    "llama_tied_sharded": (lambda: _llama(tied=True, eos=[2, 99]), {"max_shard_size": "40KB"},
                           lambda: _tokenizer(LLAMA_TOKENS), {"add_bos_token": True},
                           SpecialTokens(bos_id=1, eos_id=2, pad_id=None, eos_ids=[2, 99])),
    # The other families: no BOS in prompts (as Qwen2's and Phi-3's tokenizers), pad 0 from config.json.
    **{name: (lambda name=name: _family(name)(), {}, lambda: _tokenizer(LLAMA_TOKENS), None,
              SpecialTokens(bos_id=None, eos_id=2, pad_id=0))
       for name in ("qwen2", "mistral_window", "gemma", "phi3", "smollm", "llama3", *NEW_FAMILIES)},
}


def _save(name, path):
    build, save_kwargs, tokenizer, tokenizer_config, _ = CASES[name]
    torch.manual_seed(sorted(CASES).index(name))
    model = randomize_hf(build(), 0.3)
    model.save_pretrained(path, safe_serialization=True, **save_kwargs)
    tokenizer().save(str(path / "tokenizer.json"))
    if tokenizer_config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    model.generation_config.eos_token_id = None  # HF's generate must not stop early (saved above)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {name: (root / name, _save(name, root / name)) for name in CASES}


def _hf_greedy(model, ids):
    out = model.generate(ids, do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0)
    assert out.size(1) == ids.size(1) + NEW_TOKENS
    return out[0, ids.size(1):].tolist()


@pytest.mark.parametrize("name", list(CASES))
@torch.no_grad()
def test_import_matches_hugging_face(name, checkpoints, tmp_path, capsys):
    hf_dir, hf_model = checkpoints[name]
    run_dir = tmp_path / "run"
    assert main(["import-hf", str(hf_dir), str(run_dir)]) == 0
    out = capsys.readouterr().out
    arch = type(hf_model).__name__
    n_params = sum(p.numel() for p in hf_model.parameters())
    layers = hf_model.config.num_hidden_layers
    assert f"imported {arch} ({hf_model.config.model_type}): {n_params:,} parameters, {layers} layers, " \
           f"vocab {VOCAB}" in out
    assert f"handformer generate {run_dir} --prompt" in out

    run = load_lm(run_dir)
    assert run.tokens == CASES[name][4]
    assert run.config["source"]["model_type"] == hf_model.config.model_type
    assert run.config["source"]["hf_dir"] == str(hf_dir.resolve())
    assert run.model.num_parameters() == n_params
    assert run.tokenizer.encode("w5 w17 w5") == [5, 17, 5]

    ids = torch.randint(3, VOCAB - 1, (3, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    expected = hf_model(ids).logits
    assert expected.std() > 0.5  # far from trivial, so 1e-5 agreement means something
    # float32 rounding grows with the activations: Gemma's (embeddings times sqrt(d_model), GELU)
    # reach 300 and its logits 20, where the others stay near 100 and 10. Layer by layer the
    # difference stays at 4e-7 of the values (float32's epsilon is 1.2e-7), hence this floor.
    tol = max(1e-5, 2e-6 * expected.abs().max().item())
    torch.testing.assert_close(run.model(ids).logits, expected, atol=tol, rtol=1e-5)
    for row in ids:
        prompt = ([run.tokens.bos_id] if run.tokens.bos_id is not None else []) + row.tolist()
        hf_tokens = _hf_greedy(hf_model, torch.tensor([prompt]))
        assert generate(run.model, [prompt], NEW_TOKENS, temperature=0) == [hf_tokens]


@pytest.mark.parametrize("name", ["gpt2", "llama_untied"])
@torch.no_grad()
def test_eval_command_on_an_imported_run_gives_hugging_faces_loss(name, checkpoints, tmp_path, capsys):
    """`handformer eval RUN --data FILE` on an imported model: windows of its full context (64
    tokens) over the text's ids, after BOS for Llama (as `generate` prompts it), scored as Hugging
    Face's model scores the same windows."""
    hf_dir, hf_model = checkpoints[name]
    assert main(["import-hf", str(hf_dir), str(tmp_path / "run")]) == 0
    bos = [1] if name == "llama_untied" else []  # <s>
    words = torch.randint(3, VOCAB - 1, (3 * 64 + 1 - len(bos),), generator=torch.Generator().manual_seed(2))
    (tmp_path / "text.txt").write_text(" ".join(f"w{i}" for i in words.tolist()))
    ids = torch.tensor(bos + words.tolist())  # (193,)
    losses = [torch.nn.functional.cross_entropy(hf_model(ids[None, k:k + 64]).logits[0], ids[k + 1:k + 65])
              for k in range(0, 3 * 64, 64)]
    expected = torch.stack(losses).mean().item()
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--data", str(tmp_path / "text.txt")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("loss ") and "(192 tokens in 3 windows of 64)" in out
    assert float(out.split()[1]) == pytest.approx(expected, abs=1e-4)  # printed to 4 decimals


@torch.no_grad()
def test_generate_command_on_an_imported_run(checkpoints, tmp_path, capsys):
    """`handformer generate` prepends BOS for the Llama run and continues as Hugging Face does."""
    hf_dir, hf_model = checkpoints["llama_untied"]
    assert main(["import-hf", str(hf_dir), str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["generate", str(tmp_path / "run"), "--prompt", "w5 w6 w7", "--temperature", "0",
                 "--max-new-tokens", str(NEW_TOKENS)]) == 0
    expected = _hf_greedy(hf_model, torch.tensor([[1, 5, 6, 7]]))  # 1 = <s>
    assert capsys.readouterr().out.strip() == "w5 w6 w7 " + " ".join(f"w{i}" for i in expected)


@pytest.mark.parametrize("name", NEW_FAMILIES)
@torch.no_grad()
def test_generate_command_from_the_run_of_each_new_family(name, checkpoints, tmp_path, capsys):
    """import-hf, then `handformer generate RUN` (the model prepared for decoding as the CLI does):
    Hugging Face's greedy continuation, word for word; 14 positions run past the sliding windows
    (5) and Phi-4-mini's original context (16)."""
    hf_dir, hf_model = checkpoints[name]
    assert main(["import-hf", str(hf_dir), str(tmp_path / "run")]) == 0
    capsys.readouterr()
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    assert main(["generate", str(tmp_path / "run"), "--prompt", " ".join(f"w{i}" for i in prompt),
                 "--temperature", "0", "--max-new-tokens", "10"]) == 0
    out = hf_model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=10, pad_token_id=0)
    tokens = out[0].tolist()
    tokens = tokens[:tokens.index(2, len(prompt))] if 2 in tokens[len(prompt):] else tokens  # to EOS, as the run
    assert capsys.readouterr().out.strip() == load_lm(tmp_path / "run").tokenizer.decode(tokens)


def test_special_tokens_follow_the_files(checkpoints, tmp_path):
    """BOS is prepended exactly when the Hugging Face tokenizer would (tokenizer.json alone here);
    several EOS ids: all are recorded, and eos_id is the first."""
    for name in ("gpt2", "llama_untied"):
        hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(checkpoints[name][0] / "tokenizer.json"))
        first = hf_tok("w5 w6").input_ids[0]
        assert CASES[name][4].bos_id == (first if first != 5 else None)
    result = import_hf(checkpoints["llama_tied_sharded"][0], tmp_path / "run")
    assert not any("eos" in note for note in result.notes)
    assert load_lm(tmp_path / "run").config["source"]["eos_ids"] == [2, 99]
    assert load_lm(tmp_path / "run").tokens.eos_ids == [2, 99]


def test_special_token_sources_and_precedence(tmp_path):
    tokenizer = Tokenizer(_tokenizer(LLAMA_TOKENS))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "</s>", "pad_token": {"content": "<unk>"}, "bos_token": "<s>", "add_bos_token": True}))
    notes = []
    tokens, eos = special_tokens(tmp_path, {"eos_token_id": 2, "bos_token_id": 500}, tokenizer, VOCAB, notes)
    # generation_config.json beats config.json; an id outside the vocabulary is dropped, so BOS and
    # PAD come from the token strings of tokenizer_config.json.
    assert tokens == SpecialTokens(bos_id=1, eos_id=7, pad_id=0) and eos == [7]
    assert notes == ["config.json gives bos id(s) [500] outside the vocabulary (0..100); ignored",
                     "tokenizer_config.json has add_bos_token=true but tokenizer.json's post-processor "
                     "adds no BOS; following tokenizer_config.json"]


def test_weights_keep_their_dtype(tmp_path):
    torch.manual_seed(0)
    model = randomize_hf(_gpt2(), 0.3).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    _tokenizer(GPT2_TOKENS).save(str(tmp_path / "hf" / "tokenizer.json"))
    import_hf(tmp_path / "hf", tmp_path / "run")
    saved = load_file(tmp_path / "run" / "model.safetensors")
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert torch.equal(saved["embed.weight"], model.transformer.wte.weight)
    assert "lm_head.weight" not in saved  # tied: stored once
    run = load_lm(tmp_path / "run")
    assert run.model.embed.weight.dtype == torch.float32 and run.model.lm_head.weight is run.model.embed.weight


def test_views_of_one_storage_are_all_saved():
    """The import's parameters may be views of one fused tensor (GPT-2's c_attn split in q, k, v):
    they share a storage but are not tied, so each must be saved."""
    from handformer.training.checkpoint import unique_state_dict

    fused, module = torch.randn(6, 4), torch.nn.Module()
    module.q, module.k = torch.nn.Parameter(fused[:3]), torch.nn.Parameter(fused[3:])
    module.tied = module.q
    saved = unique_state_dict(module)
    assert list(saved) == ["q", "k"] and torch.equal(saved["k"], fused[3:])


# --- broken checkpoint directories ----------------------------------------------------------------

@pytest.fixture
def broken(checkpoints, tmp_path):
    """A copy of a checkpoint to break, and a function running the import on it: it must fail with
    exit code 2, write no run, and say `message` on stderr."""
    def copy(name):
        return shutil.copytree(checkpoints[name][0], tmp_path / name)

    def fails(hf_dir, message, capsys):
        run_dir = tmp_path / "run"
        assert main(["import-hf", str(hf_dir), str(run_dir)]) == 2
        assert message in capsys.readouterr().err
        assert not run_dir.exists()
    return copy, fails


def _edit_json(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _edit_weights(path, change):
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_missing_directory_and_files(broken, tmp_path, capsys):
    copy, fails = broken
    fails(tmp_path / "nowhere", f"no Hugging Face checkpoint directory at {tmp_path / 'nowhere'}", capsys)
    for missing, message in [("config.json", "has no config.json"),
                             ("tokenizer.json", "no tokenizer at"),
                             ("model.safetensors", "has no model.safetensors or model.safetensors.index.json")]:
        hf_dir = copy("gpt2")
        (hf_dir / missing).unlink()
        fails(hf_dir, message, capsys)
        if missing == "model.safetensors":
            (hf_dir / "pytorch_model.bin").write_bytes(b"")
            fails(hf_dir, "found pytorch_model.bin, but handformer reads only safetensors", capsys)
        shutil.rmtree(hf_dir)


def test_unknown_architecture(broken, capsys):
    copy, fails = broken
    hf_dir = copy("gpt2")
    _edit_json(hf_dir / "config.json", model_type="bert")
    fails(hf_dir, "unsupported model_type 'bert'; handformer imports GPT2LMHeadModel (model_type 'gpt2'), "
          "LlamaForCausalLM (model_type 'llama')", capsys)
    _edit_json(hf_dir / "config.json", model_type="gpt2", architectures=["GPT2ForSequenceClassification"])
    fails(hf_dir, "unsupported architectures ['GPT2ForSequenceClassification']", capsys)


def test_unimplemented_settings_are_refused_before_anything_is_written(broken, capsys):
    copy, fails = broken
    hf_dir = copy("mistral_window")
    _edit_json(hf_dir / "config.json", final_logit_softcapping=30.0)
    fails(hf_dir, "mistral config has final_logit_softcapping=30.0: soft-capping of the output logits "
          "(Gemma 2) is not implemented in handformer", capsys)
    _edit_json(hf_dir / "config.json", final_logit_softcapping=None, layer_types=["sliding_attention", "full_attention"])
    fails(hf_dir, "layer_types=['sliding_attention', 'full_attention']: layers that alternate", capsys)
    _edit_json(hf_dir / "config.json", model_type="phi", layer_types=None, architectures=["PhiForCausalLM"])
    fails(hf_dir, "unsupported model_type 'phi' (Phi-1/2 run attention and the MLP in parallel", capsys)
    _edit_json(hf_dir / "config.json", model_type="llama", architectures=["LlamaForCausalLM"],
               rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})
    fails(hf_dir, "rope scaling type 'yarn' is not implemented", capsys)


def test_unexpected_and_wrong_shaped_tensors(broken, capsys):
    copy, fails = broken
    hf_dir = copy("gpt2")
    _edit_weights(hf_dir / "model.safetensors",
                  lambda t: t.update({"transformer.h.0.attn.extra": torch.zeros(3)}))
    fails(hf_dir, "unexpected keys (1): transformer.h.0.attn.extra", capsys)
    _edit_weights(hf_dir / "model.safetensors", lambda t: t.update(
        {"transformer.h.0.attn.extra": torch.zeros(3), "transformer.wpe.weight": torch.zeros(32, 64)}))
    fails(hf_dir, "shape mismatches (1): transformer.wpe.weight: checkpoint (32, 64), expected (64, 64)", capsys)


def test_broken_shards(broken, capsys):
    copy, fails = broken
    hf_dir = copy("llama_tied_sharded")
    index = json.loads((hf_dir / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    shard = index["weight_map"]["model.norm.weight"]
    _edit_weights(hf_dir / shard, lambda t: t.pop("model.norm.weight"))
    fails(hf_dir, f"{shard} does not match model.safetensors.index.json: listed but absent: "
          "model.norm.weight", capsys)
    (hf_dir / shards[0]).unlink()
    fails(hf_dir, f"lacks 1 of the {len(shards)} shard files model.safetensors.index.json lists: "
          f"{shards[0]}", capsys)


def test_existing_run_is_kept_unless_overwrite(checkpoints, tmp_path, capsys):
    hf_dir = checkpoints["gpt2"][0]
    run_dir = tmp_path / "run"
    assert main(["import-hf", str(hf_dir), str(run_dir)]) == 0
    assert main(["import-hf", str(hf_dir), str(run_dir)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["import-hf", str(hf_dir), str(run_dir), "--overwrite"]) == 0
    assert main(["import-hf", str(hf_dir), str(hf_dir), "--overwrite"]) == 2
    assert "must differ from the checkpoint directory" in capsys.readouterr().err


def _qwen3_5_multimodal():
    text = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=56, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2,
                linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=3,
                layer_types=["linear_attention", "full_attention"], bos_token_id=1, eos_token_id=2)
    vision = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=48, patch_size=4,
                  spatial_merge_size=1, temporal_patch_size=1)
    return transformers.Qwen3_5ForConditionalGeneration(transformers.Qwen3_5Config(text_config=text,
                                                                                  vision_config=vision))


def _mistral3_multimodal():
    text = dict(model_type="ministral3", vocab_size=VOCAB, hidden_size=48, intermediate_size=56, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=24, bos_token_id=1, eos_token_id=2,
                rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                 "original_max_position_embeddings": 8, "llama_4_scaling_beta": 0.1})
    vision = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, head_dim=8,
                  patch_size=4, image_size=16)
    return transformers.Mistral3ForConditionalGeneration(transformers.Mistral3Config(text_config=text,
                                                                                    vision_config=vision))


@pytest.mark.parametrize("build", [_qwen3_5_multimodal, _mistral3_multimodal])
@torch.no_grad()
def test_a_multimodal_checkpoint_imports_its_text_model(build, tmp_path):
    """The released Qwen3.5 and Ministral 3 checkpoints wrap the text model beside a vision encoder:
    import-hf takes the text model (its tensors renamed, the vision tensors left out, a note says
    so), and its logits are the wrapper's on text alone."""
    torch.manual_seed(0)
    hf_model = randomize_hf(build(), 0.3).eval()
    hf_model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    _tokenizer(LLAMA_TOKENS).save(str(tmp_path / "hf" / "tokenizer.json"))
    result = import_hf(tmp_path / "hf", tmp_path / "run")
    assert any("left out" in note for note in result.notes), result.notes
    run = load_lm(tmp_path / "run")
    text_params = sum(p.numel() for n, p in hf_model.named_parameters() if "language_model" in n or "lm_head" in n)
    assert run.model.num_parameters() == text_params
    ids = torch.randint(3, VOCAB, (1, 19), generator=torch.Generator().manual_seed(0))
    expected = hf_model(input_ids=ids).logits
    assert torch.allclose(run.model(ids).logits, expected, atol=1e-5), (run.model(ids).logits - expected).abs().max()
