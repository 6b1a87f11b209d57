"""DeepSeek-V3 beyond the families' shared parity rows (test_hf_families.py, test_hf_export.py): the
latent KV cache and the absorbed decoding step, LoRA on the latent projections, the FP8 checkpoint
with block scales, the parameter count at the released size, and GGUF both ways as llama.cpp's
deepseek2 (names, shapes and keys against the gguf package; import(export) bit for bit; what
llama.cpp would run otherwise refused by name). llama.cpp itself and its convert_hf_to_gguf.py:
tests/test_gguf_llamacpp.py (slow).

The tiny model is test_hf_families' (`_deepseek_v3`): 3 heads of 10 + 6 dims, a key/value latent
of 14, a query latent of 18, values 12 wide, a dense layer then 8 experts in 4 groups, YaRN.
"""

import copy
import dataclasses
import json
import re

import gguf
import pytest
import torch
from helpers import randomize_hf, require_module

transformers = require_module("transformers", "pip install -e '.[dev]'")

from test_hf_families import VOCAB, _deepseek_v3  # noqa: E402

from handformer.convert.gguf_file import read_gguf  # noqa: E402
from handformer.convert.hf_weights import config_from_hf, model_from_hf  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402
from handformer.families.deepseek import LatentAttention  # noqa: E402
from handformer.nn.latent_kv_cache import LatentKVCache  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(11)
    hf_model = randomize_hf(_deepseek_v3(), 0.15)
    return hf_model, model_from_hf(hf_model.config.to_dict(), hf_model.state_dict()).eval()


@torch.no_grad()
def test_the_cache_holds_latents_and_a_decoding_step_absorbs_them_to_the_same_logits(pair, monkeypatch):
    """The cache of a left-padded batch holds, per layer, the latents (B, 1, S, 14) and one RoPE key
    (B, 1, S, 6), not the heads' keys and values; a decoding step that folds W_UK and W_UV into the
    query and output gives the logits of the step that expands every head's keys and values."""
    _, ours = pair
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    cache = ours.new_cache(16)
    ours(ids, attention_mask=mask[:, :9], cache=cache)
    assert isinstance(cache, LatentKVCache) and len(cache.latents) == 3
    assert [t.shape for t in (cache.latents[2], cache.rope_keys[2])] == [(2, 1, 16, 14), (2, 1, 16, 6)]
    step = torch.tensor([[7], [8]])
    calls, original = [], LatentAttention.attend_absorbed
    monkeypatch.setattr(LatentAttention, "attend_absorbed", lambda self, *a: calls.append(1) or original(self, *a))
    absorbed = []
    for absorb in (False, True):  # ends as the model decodes
        for layer in ours.layers:
            layer.self_attn.absorb = absorb
        cache.truncate(9)
        absorbed.append(ours(step, attention_mask=mask, cache=cache).logits)
    assert len(calls) == 3  # each layer absorbed once, at the first step
    torch.testing.assert_close(absorbed[0], absorbed[1], atol=1e-5, rtol=1e-5)
    full = ours(torch.cat([ids, step], dim=1), attention_mask=mask).logits[:, -1:]
    torch.testing.assert_close(absorbed[0], full, atol=1e-5, rtol=1e-5)


def test_lora_targets_the_latent_projections(pair):
    """LoRA reaches the latent projections by their names; a target that matches nothing lists them."""
    import copy

    from handformer.adapters.lora import LoRAConfig, add_lora

    _, ours = pair
    model = copy.deepcopy(ours)
    names = add_lora(model, LoRAConfig(rank=2, targets=["q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj"]))
    assert len(names) == 12 and "layers.1.self_attn.kv_b_proj" in names
    ids = torch.randint(3, VOCAB, (1, 8))
    with torch.no_grad():  # B = 0 at the start: the same function, through the expanded form at decoding
        torch.testing.assert_close(model(ids).logits, ours(ids).logits, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="kv_a_proj, kv_b_proj, o_proj, q_a_proj, q_b_proj"):
        add_lora(copy.deepcopy(ours), LoRAConfig(targets=["k_proj"]))


def _quantize(w, block):
    """(O, I) float -> float8 values and (ceil(O/b0), ceil(I/b1)) float32 scales, one per block."""
    O, I = w.shape
    rows, cols = -(-O // block[0]), -(-I // block[1])
    scale = torch.zeros(rows, cols)
    for r in range(rows):
        for c in range(cols):
            part = w[r * block[0]:(r + 1) * block[0], c * block[1]:(c + 1) * block[1]]
            scale[r, c] = part.abs().max() / 448.0  # e4m3's largest value
    full = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:O, :I]
    return (w / full).to(torch.float8_e4m3fn), scale


def test_an_fp8_checkpoint_with_block_scales_imports_as_its_dequantized_weights(tmp_path):
    """DeepSeek-V3's release format at tiny size: every linear weight (not the router) stored as
    float8_e4m3fn with one float32 weight_scale_inv per 16 x 16 block (odd sizes leave partial
    blocks), and a multi-token-prediction layer past num_hidden_layers. import-hf dequantizes to
    bfloat16 (tensor for tensor as written here) and skips that layer; the run's logits equal
    transformers' on the dequantized weights. Another quantization is refused by name."""
    from safetensors.torch import save_file

    from handformer.data.tokenizer import Tokenizer
    from handformer.tasks.lm.imports import import_hf
    from handformer.tasks.lm.run import load_lm

    torch.manual_seed(12)
    hf_model = randomize_hf(_deepseek_v3(), 0.15)
    hf_model.save_pretrained(tmp_path / "plain", safe_serialization=True)
    from safetensors.torch import load_file

    state = load_file(tmp_path / "plain" / "model.safetensors")
    stored, dequantized = {}, {}
    for key, w in state.items():
        if w.dim() == 2 and "proj" in key:  # the linear layers; embeddings, norms and the router stay
            q, scale = _quantize(w, (16, 16))
            stored[key], stored[key.replace(".weight", ".weight_scale_inv")] = q, scale
            full = scale.repeat_interleave(16, 0).repeat_interleave(16, 1)[:w.shape[0], :w.shape[1]]
            dequantized[key] = (q.float() * full).to(torch.bfloat16)
        else:
            stored[key] = w
    assert any(k.endswith("kv_b_proj.weight_scale_inv") for k in stored)
    stored["model.layers.3.eh_proj.weight"] = torch.zeros(4, 4)  # the MTP module's, not the model's
    fp8 = tmp_path / "fp8"
    fp8.mkdir()
    save_file(stored, fp8 / "model.safetensors")
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [16, 16],
                                     "activation_scheme": "dynamic"}
    (fp8 / "config.json").write_text(json.dumps(config))
    Tokenizer.train_char(["abcdefgh"]).save(fp8 / "tokenizer.json")
    imported = import_hf(fp8, tmp_path / "run")
    assert any("FP8" in note for note in imported.notes)
    run = load_file(tmp_path / "run" / "model.safetensors")
    assert torch.equal(run["layers.1.self_attn.kv_b_proj.weight"],
                       dequantized["model.layers.1.self_attn.kv_b_proj.weight"])
    save_file({k: v.float() for k, v in {**state, **dequantized}.items()}, tmp_path / "plain" / "model.safetensors")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()  # the dequantized
    ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(load_lm(tmp_path / "run").model(ids).logits, hf_model(ids).logits,
                                   atol=1e-5, rtol=1e-5)
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (fp8 / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quantization_config=.*mxfp4.*handformer reads FP8 .e4m3."):
        import_hf(fp8, tmp_path / "run2")


def test_the_released_size_has_671b_parameters():
    """DeepSeek-V3's config (transformers' defaults: 61 layers, 3 dense, 256 experts of 2,048, 8 per
    token from 4 of 8 groups, latents of 512 and 1,536) on the meta device: one dense and one sparse
    layer built, equal to transformers' count of the same, and the 61 layers add up to
    671,026,404,352 parameters (transformers' own count of the whole model)."""
    from handformer.families import build_causal_lm

    hf_config = transformers.DeepseekV3Config(num_key_value_heads=128, num_hidden_layers=2, first_k_dense_replace=1)
    cfg = config_from_hf(hf_config.to_dict())
    with torch.device("meta"):
        ours = build_causal_lm(cfg)
        hf_model = transformers.DeepseekV3ForCausalLM(hf_config)
    assert ours.num_parameters() == sum(p.numel() for p in hf_model.parameters())
    dense, sparse = (sum(p.numel() for p in layer.parameters()) for layer in ours.layers)
    assert ours.num_parameters() + 2 * dense + 57 * sparse == 671_026_404_352
    assert (cfg.mla.kv_rank, cfg.mla.q_rank, cfg.moe.n_experts, cfg.moe.n_groups, cfg.head_dim) == (512, 1536, 256, 8, 64)


@torch.no_grad()
def test_the_prefix_cache_stores_and_reuses_latents(pair):
    """serve's prefix cache copies the latents and RoPE keys of a prompt's beginning (columns of
    two widths) and later prompts that share it continue from them, with the same greedy tokens."""
    from handformer.generation.engine import Engine, Row, SamplingOptions
    from handformer.generation.prefix_cache import PrefixCache

    _, ours = pair
    g = torch.Generator().manual_seed(5)
    start = torch.randint(3, VOCAB, (8,), generator=g).tolist()
    prompts = [start + torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (3, 5, 2)]
    tokens = {}
    for prefix_cache in (None, PrefixCache(10**7, min_tokens=2)):
        engine, rows = Engine(ours, compact=True, prefix_cache=prefix_cache), []
        for prompt in prompts:
            rows.append(Row(prompt, 6, SamplingOptions(temperature=0)))
            engine.add(rows[-1:])
            engine.run()
        tokens[prefix_cache is None] = [row.tokens for row in rows]
    assert tokens[True] == tokens[False] and (prefix_cache.hits, prefix_cache.reused_tokens) == (2, 16)


def released_yarn(hf_model):
    """The same weights with DeepSeek-V3's released YaRN, mscale = mscale_all_dim = 1.0: cos and sin
    times 1, as llama.cpp's deepseek2 computes them (the tiny model's mscale 0.707 it cannot run)."""
    config = copy.deepcopy(hf_model.config)
    config.rope_parameters = {**config.rope_parameters, "mscale": 1.0}
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    model.load_state_dict(hf_model.state_dict())
    return model


def save_hf(hf_model, folder):
    """The checkpoint with a character tokenizer, as import-hf and convert_hf_to_gguf.py read it."""
    hf_model.save_pretrained(folder, safe_serialization=True)
    Tokenizer.train_char(["".join(map(chr, range(32, 127)))]).save(folder / "tokenizer.json")
    config = json.loads((folder / "config.json").read_text())  # as DeepSeek's own config.json says
    (folder / "config.json").write_text(json.dumps({**config, "scoring_func": "sigmoid", "topk_method": "noaux_tc"}))
    return folder


@pytest.fixture(scope="module")
def exported(pair, tmp_path_factory):
    """(transformers' model, the run imported from it, its GGUF export)."""
    from handformer.cli import main

    hf_model, tmp = released_yarn(pair[0]), tmp_path_factory.mktemp("gguf")
    assert main(["import-hf", str(save_hf(hf_model, tmp / "hf")), str(tmp / "run")]) == 0
    assert main(["export-gguf", str(tmp / "run"), str(tmp / "m.gguf")]) == 0
    return hf_model, tmp / "run", tmp / "m.gguf"


# llama.cpp's deepseek2 (src/models/deepseek2.cpp): 3 heads, latents 18 (queries) and 14 (keys and values),
# 10 + 6 dims a query/key head, values 12, width 60, 8 experts 20 wide, 2 shared, a dense layer 88 wide
DEEPSEEK2_SHAPES = {
    "blk.1.attn_q_a.weight": (18, 60), "blk.1.attn_q_a_norm.weight": (18,), "blk.1.attn_q_b.weight": (48, 18),
    "blk.1.attn_kv_a_mqa.weight": (20, 60), "blk.1.attn_kv_a_norm.weight": (14,),
    "blk.1.attn_k_b.weight": (3, 14, 10), "blk.1.attn_v_b.weight": (3, 12, 14), "blk.1.attn_output.weight": (60, 36),
    "blk.0.ffn_gate.weight": (88, 60), "blk.0.ffn_down.weight": (60, 88), "blk.1.ffn_gate_inp.weight": (8, 60),
    "blk.1.exp_probs_b.bias": (8,), "blk.1.ffn_gate_exps.weight": (8, 20, 60), "blk.1.ffn_down_exps.weight": (8, 60, 20),
    "blk.1.ffn_up_shexp.weight": (40, 60), "blk.1.ffn_down_shexp.weight": (60, 40)}
DEEPSEEK2_KEYS = {  # gguf.Keys template -> the value llama.cpp reads
    gguf.Keys.Attention.HEAD_COUNT_KV: 1, gguf.Keys.Attention.KEY_LENGTH: 20, gguf.Keys.Attention.VALUE_LENGTH: 14,
    gguf.Keys.Attention.KEY_LENGTH_MLA: 16, gguf.Keys.Attention.VALUE_LENGTH_MLA: 12,
    gguf.Keys.Attention.Q_LORA_RANK: 18, gguf.Keys.Attention.KV_LORA_RANK: 14, gguf.Keys.Rope.DIMENSION_COUNT: 6,
    gguf.Keys.LLM.LEADING_DENSE_BLOCK_COUNT: 1, gguf.Keys.LLM.FEED_FORWARD_LENGTH: 88,
    gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH: 20, gguf.Keys.LLM.EXPERT_COUNT: 8, gguf.Keys.LLM.EXPERT_USED_COUNT: 3,
    gguf.Keys.LLM.EXPERT_SHARED_COUNT: 2, gguf.Keys.LLM.EXPERT_GROUP_COUNT: 4, gguf.Keys.LLM.EXPERT_GROUP_USED_COUNT: 2,
    gguf.Keys.LLM.EXPERT_GATING_FUNC: gguf.ExpertGatingFuncType.SIGMOID.value,
    gguf.Keys.LLM.EXPERT_WEIGHTS_SCALE: 2.5, gguf.Keys.LLM.EXPERT_WEIGHTS_NORM: True,
    gguf.Keys.Rope.SCALING_TYPE: "yarn", gguf.Keys.Rope.SCALING_FACTOR: 4.0, gguf.Keys.Rope.SCALING_ORIG_CTX_LEN: 16,
    gguf.Keys.Rope.SCALING_YARN_BETA_FAST: 32.0, gguf.Keys.Rope.SCALING_YARN_BETA_SLOW: 1.0,
    gguf.Keys.Rope.SCALING_YARN_LOG_MUL: 0.1}  # llama.cpp's 0.1 x mscale_all_dim


def test_gguf_export_writes_llama_cpps_deepseek2(exported):
    """Every tensor a name of the gguf package's deepseek2 with llama.cpp's shape (kv_b_proj split per
    head into attn_k_b, transposed, and attn_v_b; the dense layer 0, then experts, their correction
    bias and the shared experts), and the keys llama.cpp reads."""
    file = read_gguf(exported[2])
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.DEEPSEEK2]}
    assert file.architecture == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.DEEPSEEK2]
    assert {re.sub(r"blk\.\d+", "blk.{bid}", n).rsplit(".", 1)[0] for n in file.tensors} <= known
    assert {n: file.tensors[n].shape for n in DEEPSEEK2_SHAPES} == DEEPSEEK2_SHAPES
    assert len(file.tensors) == 52 and not any(n.startswith(("blk.0.ffn_gate_", "blk.1.ffn_gate.")) for n in file.tensors)
    keys = {template.format(arch="deepseek2"): value for template, value in DEEPSEEK2_KEYS.items()}
    assert {k: file.metadata.get(k) for k in keys} == keys


@torch.no_grad()
def test_gguf_import_of_the_export_is_the_run_again_with_transformers_logits(exported, tmp_path):
    from handformer.cli import main
    from handformer.tasks.lm.run import load_lm

    hf_model, run_dir, path = exported
    assert main(["import-gguf", str(path), str(tmp_path / "back")]) == 0
    run, back = load_lm(run_dir), load_lm(tmp_path / "back")
    assert back.model.cfg == run.model.cfg and back.config["source"]["model_type"] == "deepseek_v3"
    ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))
    logits = back.model(ids).logits
    assert torch.equal(logits, run.model(ids).logits)
    torch.testing.assert_close(logits, hf_model(ids).logits, atol=1e-5, rtol=1e-5)


def test_gguf_refuses_what_llama_cpps_deepseek2_runs_otherwise(pair, exported):
    """The tiny model's mscale 0.707 (llama.cpp multiplies cos and sin by 1: its logits differ by up to
    2 of 4) and RoPE on halves are refused by name; a file routing with a softmax (DeepSeek-V2's,
    llama.cpp's default without the key) is refused naming the key."""
    from handformer.convert.gguf_arch import family_for, mismatches, read_hparams

    cfg = pair[1].cfg
    family = family_for(cfg, "deepseek_v3")
    assert family.arch == "deepseek2" and family_for(cfg, None) is family
    (problem,) = mismatches(cfg, family)
    assert problem.startswith("rope_scaling=YarnRopeScaling(") and "mscale=0.707" in problem
    assert "needs mscale = mscale_all_dim" in problem
    released = dataclasses.replace(cfg, rope_scaling=dataclasses.replace(cfg.rope_scaling, mscale=1.0))
    assert mismatches(released, family) == []
    halves = dataclasses.replace(released, mla=dataclasses.replace(cfg.mla, interleave=False))
    assert [p.split(" (")[0] for p in mismatches(halves, family)] == ["mla.interleave=False"]
    metadata = read_gguf(exported[2]).metadata
    with pytest.raises(ValueError, match=r"m.gguf: deepseek2.expert_gating_func=None routes experts with a softmax"):
        read_hparams({k: v for k, v in metadata.items() if "gating" not in k}, family, "m.gguf")


@torch.no_grad()
def test_the_int8_prepared_model_runs_through_the_expanded_form(pair):
    """Every linear layer int8 (latent projections, experts, router), then fused and packed for
    decoding: kv_b_proj is no plain Linear, so decoding expands the latents; the left-padded
    logits stay within 6% of the float model's scale (measured: 4.3% at these tiny random weights)."""
    import copy

    from handformer.generation.generate import generate
    from handformer.inference.prepare import prepare_for_decoding
    from handformer.inference.quant import Int8Linear, quantize_linears

    _, ours = pair
    model = copy.deepcopy(ours)
    quantize_linears(model)
    prepare_for_decoding(model)
    assert isinstance(model.layers[1].self_attn.kv_b_proj, Int8Linear)
    assert not model.layers[1].self_attn.absorbs(object(), 1)
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    plain, int8 = (m(ids, attention_mask=mask).logits[mask.bool()] for m in (ours, model))
    assert (int8 - plain).abs().max() < 0.06 * plain.abs().max()
    assert len(generate(model, [ids[0].tolist()], 8, temperature=0)[0]) == 8
