"""DeepSeek-V3 beyond the families' shared parity rows (test_hf_families.py, test_hf_export.py): the
latent KV cache and the absorbed decoding step, LoRA on the latent projections, the FP8 checkpoint
with block scales, and the parameter count at the released size.

The tiny model is test_hf_families' (`_deepseek_v3`): 3 heads of 10 + 6 dims, a key/value latent
of 14, a query latent of 18, values 12 wide, a dense layer then 8 experts in 4 groups, YaRN.
"""

import json

import pytest
import torch
from helpers import randomize_hf, require_module

transformers = require_module("transformers", "pip install -e '.[dev]'")

from test_hf_families import VOCAB, _deepseek_v3  # noqa: E402

from handformer.convert.hf_weights import config_from_hf, model_from_hf  # noqa: E402
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


def test_gguf_refuses_deepseek_by_name(pair):
    """llama.cpp's deepseek2 has no entry in export-gguf or import-gguf: an imported run is refused
    naming it and why, a run trained with latent attention names the setting."""
    from handformer.convert.gguf_arch import family_for, mismatches

    _, ours = pair
    with pytest.raises(ValueError, match=r"model_type 'deepseek_v3' \(llama.cpp's deepseek2: DeepSeek-V3 keeps "
                                         r"latent attention .*which export-gguf does not write yet\)"):
        family_for(ours.cfg, "deepseek_v3")
    assert any(p.startswith("mla=MLAConfig(") and "multi-head latent attention" in p
               for p in mismatches(ours.cfg, family_for(ours.cfg, None)))


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
