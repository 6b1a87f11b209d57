"""`handformer export-hf`: language-model runs -> Hugging Face directories that transformers loads.

Runs are built with random weights (norm gains and biases randomized too, so a swapped tensor
shows): GPT-2 style (tied, without biases like the baby GPT, q/k/v biases only), Llama style (GQA,
untied; tied with Llama 3 rope scaling; with biases), and the settings that point to Qwen2, Mistral
and Gemma; and runs imported from tiny random Hugging Face models of every family import-hf reads
(GPT-2, Llama, SmolLM, Llama 3, Qwen2 with and without a sliding window, Mistral, Gemma, Phi-3), also
fully fine-tuned and LoRA-merged. Each export must load with AutoModelForCausalLM and
PreTrainedTokenizerFast, give handformer's logits and greedy tokens (sequences several sliding
windows long), and import back to the same weights bit for bit.
"""

import json
from dataclasses import replace

import pytest
import torch
from helpers import randomize_hf, require_module
from safetensors.torch import load_file

transformers = require_module("transformers", "pip install -e '.[dev]'")

from handformer.cli import main  # noqa: E402
from handformer.config import CausalLMConfig, FamilyConfig, Llama3RopeScaling, MoEConfig  # noqa: E402
from handformer.data.special_tokens import SpecialTokens  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402
from handformer.families import build_causal_lm  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.tasks.lm.imports import import_hf  # noqa: E402
from handformer.tasks.lm.run import load_lm, save_lm_run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = "to be or not to be, that is the question: whether 'tis nobler in the mind to suffer\n"
NEW_TOKENS = 8

WINDOW = 5  # sliding windows: the prompts below are 12 tokens, continued by 8


def _llama(v, **overrides):
    return CausalLMConfig.llama_style(**{**dict(vocab_size=v, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48,
                                                n_layers=2, max_positions=48, rope_theta=500.0), **overrides})


def _gpt2(v, **overrides):
    return CausalLMConfig.gpt2_style(vocab_size=v, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_positions=48,
                                     **overrides)


SCALING = Llama3RopeScaling(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=16)
# preset -> (config, the architecture its settings map to)
PRESETS = {
    "gpt2_tied": (_gpt2, "GPT2LMHeadModel"),
    "gpt2_nobias_gelu": (lambda v: _gpt2(v, bias=False, activation="gelu"), "GPT2LMHeadModel"),
    "gpt2_qkv_bias_only": (lambda v: _gpt2(v, bias=False, qkv_bias=True), "GPT2LMHeadModel"),
    "llama_gqa": (_llama, "LlamaForCausalLM"),
    "llama_bias": (lambda v: _llama(v, bias=True), "LlamaForCausalLM"),
    "llama3_tied": (lambda v: _llama(v, tie_embeddings=True, rope_scaling=SCALING), "LlamaForCausalLM"),
    "qwen2_style": (lambda v: _llama(v, qkv_bias=True, tie_embeddings=True), "Qwen2ForCausalLM"),
    "qwen2_window": (lambda v: _llama(v, qkv_bias=True, sliding_window=WINDOW, rope_scaling=SCALING),
                     "Qwen2ForCausalLM"),
    "mistral_style": (lambda v: _llama(v, sliding_window=WINDOW, rope_scaling=SCALING), "MistralForCausalLM"),
    "gemma_style": (lambda v: _llama(v, norm="rmsnorm_offset", activation="geglu_tanh", scale_embeddings=True,
                                     tie_embeddings=True, head_dim=16, n_kv_heads=1), "GemmaForCausalLM"),
    # today's families, from settings a run trained here may have
    "qwen3_style": (lambda v: _llama(v, qk_norm="head", tie_embeddings=True), "Qwen3ForCausalLM"),
    "gemma2_style": (lambda v: _llama(v, norm="rmsnorm_offset", activation="geglu_tanh", scale_embeddings=True,
                                      tie_embeddings=True, norm_placement="sandwich", attn_scale_dim=12,
                                      attn_softcap=20.0, logit_softcap=10.0, sliding_window=WINDOW,
                                      global_layers=[1]), "Gemma2ForCausalLM"),
    "olmo2_style": (lambda v: _llama(v, norm_placement="reordered", qk_norm="width"), "Olmo2ForCausalLM"),
    "mixtral_style": (lambda v: _llama(v, moe=MoEConfig(n_experts=4, top_k=2)), "MixtralForCausalLM"),
    "qwen3_moe_style": (lambda v: _llama(v, qk_norm="head", moe=MoEConfig(n_experts=4, top_k=2, d_expert=24,
                                                                          normalize=False)),
                        "Qwen3MoeForCausalLM"),
}
GRANITE = dict(embedding_multiplier=12.0, attention_multiplier=0.03125, residual_multiplier=0.22, logits_scaling=1.5)
PRESETS["granite_style"] = (lambda v: _llama(v, tie_embeddings=True, family=FamilyConfig(**GRANITE)),
                            "GraniteForCausalLM")
PRESETS["glm4_style"] = (lambda v: _llama(v, norm_placement="sandwich", bias=False, qkv_bias=True, rope_fraction=0.5),
                         "Glm4ForCausalLM")
ZERO_BIASES = ("gpt2_nobias_gelu", "gpt2_qkv_bias_only")  # GPT-2 gets the missing biases as zeros


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
    model = _randomize(build_causal_lm(PRESETS[preset][0](tok.vocab_size)))
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
    bos = [] if run.tokens.bos_id is None else [run.tokens.bos_id]
    assert hf_tok(prompt)["input_ids"] == bos + ids  # prompts as `handformer generate` feeds them
    ids = bos + ids
    batch = torch.tensor([ids, ids[::-1]])
    with torch.no_grad():
        expected = run.model(batch).logits
        assert expected.std() > 0.5  # far from trivial
        torch.testing.assert_close(hf_model(batch).logits, expected, atol=1e-5, rtol=1e-5)
        assert generate(run.model, [ids], NEW_TOKENS, temperature=0)[0] == _hf_greedy(hf_model, ids)
    return run, hf_model


@pytest.mark.parametrize("preset", list(PRESETS))
def test_export_loads_in_transformers_and_matches(preset, tmp_path, capsys):
    tokens = SpecialTokens(bos_id=1 if preset == "llama3_tied" else None, eos_id=2, pad_id=0)
    run_dir = _run(tmp_path, preset, tokens)
    out = tmp_path / "hf"
    assert main(["export-hf", str(run_dir), str(out)]) == 0
    printed = capsys.readouterr().out
    arch = PRESETS[preset][1]
    assert f"exported {arch}" in printed
    assert ("bias=false" in printed) == (preset in ZERO_BIASES)
    _, hf_model = _check_equal(run_dir, out, "to be or not")
    assert type(hf_model).__name__ == arch
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["eos_token_id"], generation["pad_token_id"]) == (2, 0)
    assert generation["bos_token_id"] == tokens.bos_id
    config = json.loads((out / "config.json").read_text())
    scaled = preset in ("llama3_tied", "qwen2_window", "mistral_style")
    assert ("rope_scaling" in config) == scaled  # transformers 4's key for the scaling, as well
    assert not scaled or config["rope_scaling"] == config["rope_parameters"] and config["rope_scaling"][
        "rope_type"] == "llama3"
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
    assert bool(extra) == (preset in ZERO_BIASES)
    assert load_lm(back).tokens == tokens
    if preset not in ZERO_BIASES:  # the same settings again (import sets dropout 0)
        assert load_lm(back).model.cfg == replace(load_lm(run_dir).model.cfg, dropout=0.0)


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


SIZE = dict(vocab_size=40, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
            num_hidden_layers=2, max_position_embeddings=48, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ROPE = {"rope_type": "default", "rope_theta": 1e4}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
# family -> a tiny Hugging Face model of it, as import-hf reads it (the settings each family varies)
FAMILIES = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=40, n_embd=32, n_head=4, n_layer=2, n_positions=48, bos_token_id=1, eos_token_id=2)),
    "smollm": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{**SIZE, "hidden_size": 72, "num_attention_heads": 9, "num_key_value_heads": 3},
        tie_word_embeddings=True, rope_parameters=ROPE)),
    "llama3": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **SIZE, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SIZE, tie_word_embeddings=True, use_sliding_window=False, rope_parameters={**ROPE, "rope_theta": 1e6})),
    "qwen2_window": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SIZE, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0, rope_parameters=ROPE)),
    "mistral_window": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        **SIZE, sliding_window=WINDOW, rope_parameters=ROPE)),
    "gemma": lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(
        **{**SIZE, "num_key_value_heads": 1}, head_dim=16, hidden_act="gelu_pytorch_tanh", rope_parameters=ROPE)),
    "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZE, sliding_window=WINDOW, tie_word_embeddings=False, rope_parameters=ROPE)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **{**SIZE, "num_hidden_layers": 3}, head_dim=16, tie_word_embeddings=True, use_sliding_window=True,
        sliding_window=WINDOW, max_window_layers=1, rope_parameters=ROPE)),
    "gemma2": lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **SIZE, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=12, rope_parameters=ROPE)),
    "gemma3_text": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **{**SIZE, "num_key_value_heads": 1}, head_dim=256, sliding_window=WINDOW, sliding_window_pattern=2,
        query_pre_attn_scalar=256, attn_implementation="sdpa",
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}})),
    "smollm3": lambda: transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(
        **{**SIZE, "num_hidden_layers": 4}, rope_parameters=ROPE)),
    "olmo2": lambda: transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**SIZE, rope_parameters=ROPE)),
    "phi4_mini": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZE, tie_word_embeddings=True, original_max_position_embeddings=16, partial_rotary_factor=0.75,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.75,
                         "short_factor": [1.0, 1.1, 1.2], "long_factor": [2.0, 2.5, 3.0]})),
    "mixtral": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **SIZE, num_local_experts=4, num_experts_per_tok=2, rope_parameters=ROPE)),
    "qwen3_moe": lambda: transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        **SIZE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True,
        rope_parameters=ROPE)),
    "qwen2_moe": lambda: transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        **SIZE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40,
        rope_parameters=ROPE)),
    "olmoe": lambda: transformers.OlmoeForCausalLM(transformers.OlmoeConfig(
        **SIZE, num_experts=4, num_experts_per_tok=2, rope_parameters=ROPE)),
    "gpt_oss": lambda: transformers.GptOssForCausalLM(transformers.GptOssConfig(
        **{**SIZE, "num_hidden_layers": 3}, head_dim=12, num_local_experts=3, num_experts_per_tok=2,
        sliding_window=WINDOW, swiglu_limit=1.5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 16})),
    "deepseek_v3": lambda: transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        **{**SIZE, "num_key_value_heads": 4}, moe_intermediate_size=12, first_k_dense_replace=1, n_routed_experts=6,
        n_group=3, topk_group=2, num_experts_per_tok=2, n_shared_experts=1, kv_lora_rank=10, q_lora_rank=None,
        qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, rope_interleave=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 3.0,
                         "original_max_position_embeddings": 16, "mscale_all_dim": 1.0})),
}
FAMILIES["granite"] = lambda: transformers.GraniteForCausalLM(transformers.GraniteConfig(
    **{**SIZE, "hidden_size": 60, "num_attention_heads": 6, "intermediate_size": 86}, **GRANITE, rope_parameters=ROPE))
# today's open families, at odd sizes: 6 heads of 12 over a width of 42 (Seed-OSS: q/k/v biases)
ODD = {**SIZE, "hidden_size": 42, "num_attention_heads": 6, "head_dim": 12, "intermediate_size": 38}
FAMILIES.update(
    seed_oss=lambda: transformers.SeedOssForCausalLM(transformers.SeedOssConfig(**ODD, rope_parameters=ROPE)),
    ernie4_5=lambda: transformers.Ernie4_5ForCausalLM(transformers.Ernie4_5Config(  # RoPE on pairs, biases
        **ODD, use_bias=True, rope_parameters=ROPE)),
    hunyuan=lambda: transformers.HunYuanDenseV1ForCausalLM(transformers.HunYuanDenseV1Config(  # NTK alpha
        **ODD, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "alpha": 1000.0, "factor": 1.0})),
    olmo3=lambda: transformers.Olmo3ForCausalLM(transformers.Olmo3Config(  # layers 0-2, 4 slide
        **{**ODD, "num_hidden_layers": 5}, sliding_window=5, rope_parameters={
            "sliding_attention": {**ROPE, "rope_theta": 5e5}, "full_attention": {**ROPE, "rope_theta": 5e5}})),
)
FAMILIES["apertus"] = lambda: transformers.ApertusForCausalLM(transformers.ApertusConfig(  # xIELU, q/k norms
    **ODD, rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 4.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}))
FAMILIES["qwen3_5"] = lambda: transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(  # DeltaNet 0, 2
    **{**ODD, "num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 8}, linear_num_key_heads=2,
    linear_num_value_heads=6, linear_key_head_dim=4, linear_value_head_dim=6, linear_conv_kernel_dim=3,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    rope_parameters={**ROPE, "partial_rotary_factor": 0.25}))
FAMILIES["glm4"] = lambda: transformers.Glm4ForCausalLM(transformers.Glm4Config(  # GLM-4-32B's: no biases
    **ODD, attention_bias=False, rope_parameters={**ROPE, "partial_rotary_factor": 0.5}))
FAMILIES["exaone4"] = lambda: transformers.Exaone4ForCausalLM(transformers.Exaone4Config(  # layer 3 global, NoPE
    **{**ODD, "num_hidden_layers": 5}, sliding_window=5, sliding_window_pattern=4, rope_parameters=ROPE))
FAMILIES["ministral3"] = lambda: transformers.Ministral3ForCausalLM(transformers.Ministral3Config(  # queries scaled
    **ODD, sliding_window=5, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0, "mscale": 1.0,
                                              "mscale_all_dim": 1.0, "original_max_position_embeddings": 8,
                                              "llama_4_scaling_beta": 0.5}))
FAMILIES["olmo3_yarn"] = lambda: transformers.Olmo3ForCausalLM(transformers.Olmo3Config(  # YaRN on the global layer
    **{**ODD, "num_hidden_layers": 4}, sliding_window=5, rope_parameters={
        "sliding_attention": {**ROPE, "rope_theta": 5e5},
        "full_attention": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "original_max_position_embeddings": 8,
                           "attention_factor": 1.2079441541679836}}))
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def _hf_checkpoint(family, path):
    """A tiny random checkpoint of `family` at `path`, with a character tokenizer; llama3's names
    two EOS ids, prompts with BOS (tokenizer_config.json) and has a chat template."""
    torch.manual_seed(sorted(FAMILIES).index(family))
    hf_model = randomize_hf(FAMILIES[family](), 0.15)
    if family == "llama3":
        hf_model.generation_config.eos_token_id = [2, 3]
    hf_model.save_pretrained(path, safe_serialization=True)
    Tokenizer.train_char([TEXT]).save(path / "tokenizer.json")
    if family == "llama3":
        (path / "tokenizer_config.json").write_text(json.dumps(
            {"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}))
    return hf_model


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_import_reads_goes_back_to_its_architecture(family, tmp_path):
    """Hugging Face checkpoint -> import-hf -> export-hf: the same architecture and config, the
    checkpoint's own tensors bit for bit, transformers' logits and greedy tokens equal handformer's
    over several sliding windows, and the special tokens and chat template carried over."""
    hf_model = _hf_checkpoint(family, tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "run")
    assert main(["export-hf", str(tmp_path / "run"), str(tmp_path / "again")]) == 0
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert config["model_type"] == hf_model.config.model_type
    assert config["architectures"] == [type(hf_model).__name__]
    before = load_file(tmp_path / "hf" / "model.safetensors")
    after = load_file(tmp_path / "again" / "model.safetensors")
    before = {k: v for k, v in before.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    assert set(before) == set(after)
    for key in before:
        assert torch.equal(before[key], after[key]), key
    run, exported = _check_equal(tmp_path / "run", tmp_path / "again", "not to be, or")
    ours, theirs = exported.config.to_dict(), hf_model.config.to_dict()
    compared = {"sliding_window", "use_sliding_window", "layer_types", "rope_parameters", "tie_word_embeddings",
                "head_dim", "num_key_value_heads", "hidden_act", "attention_bias", "query_pre_attn_scalar",
                "attn_logit_softcapping", "final_logit_softcapping", "no_rope_layers", "partial_rotary_factor",
                "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size", "norm_topk_prob", "intermediate_size",
                "router_aux_loss_coef", "swiglu_limit", "swiglu_alpha", "kv_lora_rank", "q_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave", "n_routed_experts",
                "n_group", "topk_group", "n_shared_experts", "routed_scaling_factor",
                "first_k_dense_replace", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim"} & ours.keys() & theirs.keys()
    assert {"rope_parameters", "tie_word_embeddings"} <= compared or family == "gpt2"

    def same_meaning(config, key):  # what a default stands for, written out
        value = config[key]
        if key == "head_dim" and value is None:
            return config["hidden_size"] // config["num_attention_heads"]
        if key == "rope_parameters" and value.get("alpha"):  # Hunyuan's NTK alpha: a base of its own
            dim = config["head_dim"]
            return {"rope_type": "default", "rope_theta": value["rope_theta"] * value["alpha"] ** (dim / (dim - 2))}
        if key == "rope_parameters" and value.get("partial_rotary_factor") == 1.0:
            return {k: v for k, v in value.items() if k != "partial_rotary_factor"}
        if key == "rope_parameters" and "full_attention" in value and "sliding_attention" in value:  # OLMo 3
            return {kind: same_meaning({**config, key: value[kind]}, key) for kind in value}
        return value

    assert {k: same_meaning(ours, k) for k in compared} == {k: same_meaning(theirs, k) for k in compared}
    generation = json.loads((tmp_path / "again" / "generation_config.json").read_text())
    if family == "llama3":
        assert (generation["eos_token_id"], generation["bos_token_id"]) == ([2, 3], 1)
        tok_config = json.loads((tmp_path / "again" / "tokenizer_config.json").read_text())
        assert tok_config["chat_template"] == CHAT_TEMPLATE
    else:
        assert (generation["eos_token_id"], generation["bos_token_id"]) == (2, None)
    back = tmp_path / "back"
    import_hf(tmp_path / "again", back)
    original, returned = load_file(tmp_path / "run" / "model.safetensors"), load_file(back / "model.safetensors")
    assert original.keys() == returned.keys()
    assert all(torch.equal(original[k], returned[k]) for k in original)
    assert load_lm(back).tokens == run.tokens and load_lm(back).model.cfg == run.model.cfg


@pytest.mark.parametrize("change,message", [
    ({"norm_placement": "post"}, "norm_placement='post' (GPT-2 is pre-norm)"),
    ({"position": "sinusoidal"}, "position='sinusoidal' maps to no Hugging Face architecture"),
    ({"activation": "swiglu"}, "activation='swiglu' (GPT-2 supports"),
    ({"position": "rope", "activation": "gelu"}, "norm='layernorm' (Llama uses RMSNorm); activation='gelu'"),
    ({"scale_embeddings": True}, "scale_embeddings=True"),
    ({"head_dim": 16}, "head_dim=16 (GPT-2's heads are d_model / n_heads wide)"),
    ({"sliding_window": 4}, "sliding_window=4 (GPT-2 has no sliding-window attention)"),
    ({"n_kv_heads": 2}, "n_kv_heads=2 (GPT-2 has one key/value head per query head)"),
    ({"position": "rope", "norm": "rmsnorm", "activation": "swiglu", "norm_placement": "post"},
     "norm_placement='post' (Llama is pre-norm)"),
    ({"position": "rope", "norm": "rmsnorm", "activation": "swiglu", "sliding_window": 4},
     "cannot export to MistralForCausalLM: bias=True (Mistral has no biases)"),
    ({"position": "rope", "norm": "rmsnorm", "activation": "gelu", "bias": False, "qkv_bias": True},
     "cannot export to Qwen2ForCausalLM: activation='gelu' (Qwen2 has a SwiGLU MLP)"),
    ({"position": "rope", "norm": "rmsnorm_offset", "activation": "swiglu", "scale_embeddings": True},
     "cannot export to GemmaForCausalLM: activation='swiglu' (Gemma has a GeGLU MLP with the tanh GELU); "
     "bias=True (Gemma has no biases)"),
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


def test_a_recorded_architecture_that_cannot_hold_a_setting_is_named(tmp_path, capsys):
    """A run recorded as Phi-3 (its config edited) with Llama 3 rope scaling: transformers' Phi-3
    refuses that scaling type, so the export does, instead of writing a directory it cannot load."""
    tok = Tokenizer.train_char([TEXT])
    cfg = _llama(tok.vocab_size, rope_scaling=SCALING)
    save_lm_run(tmp_path / "run", CausalLM(cfg), tok, SpecialTokens(), source={"model_type": "phi3"})
    assert main(["export-hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert "cannot export to Phi3ForCausalLM: rope_scaling=Llama3RopeScaling(" in err
    assert "(Phi-3 takes only 'longrope' scaling in transformers" in err and err.count("\n") == 1
    save_lm_run(tmp_path / "run", CausalLM(cfg), tok, SpecialTokens(), source={"model_type": "bert"})
    assert main(["export-hf", str(tmp_path / "run"), str(tmp_path / "hf")]) == 2
    assert "imported from model_type 'bert'; export-hf writes gpt2, llama" in capsys.readouterr().err


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


def test_a_bfloat16_checkpoint_goes_back_in_bfloat16_bit_for_bit(tmp_path):
    """Real checkpoints are bfloat16: the run keeps that dtype on disk, and so does the export."""
    hf_model = _hf_checkpoint("qwen2", tmp_path / "hf32")
    hf_model.to(torch.bfloat16).save_pretrained(tmp_path / "hf", safe_serialization=True)
    (tmp_path / "hf32" / "tokenizer.json").rename(tmp_path / "hf" / "tokenizer.json")
    import_hf(tmp_path / "hf", tmp_path / "run")
    assert main(["export-hf", str(tmp_path / "run"), str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again" / "config.json").read_text())["dtype"] == "bfloat16"
    before = load_file(tmp_path / "hf" / "model.safetensors")
    after = load_file(tmp_path / "again" / "model.safetensors")
    assert before.keys() == after.keys()
    assert all(after[k].dtype == torch.bfloat16 and torch.equal(before[k], after[k]) for k in before)


def _finetune(out, base, text, *pairs):
    sets = ["train.progress=false", "train.device=cpu", f"data.path={text}", "data.block_size=16",
            "data.batch_size=4", "data.eval_batches=1", "train.steps=4", "train.eval_every=4", "train.warmup=1",
            "train.lr=1e-2", *pairs]
    return main(["train", "--init-from", str(base), "--out", str(out), *[a for p in sets for a in ("--set", p)]])


def test_fine_tuned_and_merged_runs_export_in_their_base_runs_architecture(tmp_path, capsys):
    """An imported Phi-3 fine-tuned fully, and with LoRA then merged: both go back to Phi3ForCausalLM
    (found through init_from / merged_from) with their own, changed weights. Once the base run is
    gone, the settings decide (a sliding window: Mistral), and a note says so."""
    _hf_checkpoint("phi3", tmp_path / "hf")
    import_hf(tmp_path / "hf", tmp_path / "base")
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 20)
    assert _finetune(tmp_path / "full", tmp_path / "base", text) == 0
    assert _finetune(tmp_path / "lora", tmp_path / "base", text, "train.lora.rank=4", "train.lora.alpha=8") == 0
    assert main(["merge", str(tmp_path / "lora"), str(tmp_path / "merged")]) == 0
    base = load_file(tmp_path / "base" / "model.safetensors")
    for name in ("full", "merged"):
        assert main(["export-hf", str(tmp_path / name), str(tmp_path / f"{name}-hf")]) == 0
        assert "exported Phi3ForCausalLM (phi3)" in capsys.readouterr().out
        weights = load_file(tmp_path / name / "model.safetensors")
        assert not torch.equal(weights["layers.0.self_attn.q_proj.weight"], base["layers.0.self_attn.q_proj.weight"])
        _check_equal(tmp_path / name, tmp_path / f"{name}-hf", "to be or not")
    (tmp_path / "base").rename(tmp_path / "moved")
    assert main(["export-hf", str(tmp_path / "full"), str(tmp_path / "full-hf2")]) == 0
    printed = capsys.readouterr().out
    assert "exported MistralForCausalLM" in printed and "is gone, so the architecture follows the settings" in printed
    _check_equal(tmp_path / "full", tmp_path / "full-hf2", "to be or not")
