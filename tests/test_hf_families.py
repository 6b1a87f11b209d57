"""Parity with tiny random Hugging Face models of the families beyond GPT-2 and Llama: Qwen2, Mistral
(with and without a sliding window), Gemma, Phi-3, SmolLM (Llama with 9 query / 3 key-value heads,
tied), Llama 3.x rope scaling; and today's families: Qwen3 (q/k norms per head; also with sliding
and global layers mixed), Gemma 2 (soft-capping, four norms a block, sliding and global layers),
Gemma 3 (at the 270M / 1B settings: head_dim 256, five sliding layers to one global, two RoPE bases;
and with linear scaling on the global layers), SmolLM3 (layers without RoPE), OLMo 2 (norms after
the sublayers, q/k norms over the width), Phi-4-mini (partial RoPE and LongRoPE, tied), and the
mixtures of experts Mixtral, Qwen3-MoE, Qwen2-MoE (a shared expert) and OLMoE.

Each model is built from a config (no download), every parameter randomized, imported with
handformer.convert.hf_weights, then compared with Hugging Face: logits at every position, batched
left-padded prompts, and greedy generation with and without the KV cache, token for token. The
sliding windows are a few positions wide and the sequences run several windows beyond them;
Phi-4-mini's generation crosses its original context, where LongRoPE changes factors.
"""

import copy
import functools
import math
import re

import pytest
import torch
from helpers import randomize_hf, require_module

transformers = require_module("transformers", "pip install -e '.[dev]'")

from handformer.config import (  # noqa: E402
    DeltaNetConfig,
    FamilyConfig,
    LinearRopeScaling,
    Llama3RopeScaling,
    MLAConfig,
    MoEConfig,
    YarnRopeScaling,
)
from handformer.convert.hf_weights import config_from_hf, model_from_hf  # noqa: E402
from handformer.generation.engine import Engine, Row, SamplingOptions  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.inference.fuse import FusedSelfAttention  # noqa: E402
from handformer.inference.packed_linear import pack_linears  # noqa: E402
from handformer.inference.prepare import prepare_for_decoding  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 101
WINDOW = 5  # sliding windows; sequences below are 3 to 6 windows long
SIZE = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, num_hidden_layers=2, max_position_embeddings=64,
            attention_dropout=0.0, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            attn_implementation="eager")


def _qwen2():
    # sliding_window is set but use_sliding_window is false: Hugging Face attends to everything.
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SIZE, tie_word_embeddings=True, rms_norm_eps=1e-6, use_sliding_window=False, sliding_window=3,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6}))


def _mistral(window):
    return transformers.MistralForCausalLM(transformers.MistralConfig(
        **SIZE, sliding_window=window, rope_parameters={"rope_type": "default", "rope_theta": 1e4}))


def _gemma():
    size = {**SIZE, "num_key_value_heads": 1}
    # head_dim 24 while hidden_size / heads = 16; "gelu" is Gemma's legacy name for the tanh GELU.
    return transformers.GemmaForCausalLM(transformers.GemmaConfig(
        **size, head_dim=24, hidden_act="gelu", rope_parameters={"rope_type": "default", "rope_theta": 1e4}))


def _phi3():
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZE, sliding_window=WINDOW, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4}))


def _smollm():
    size = {**SIZE, "hidden_size": 72, "num_attention_heads": 9, "num_key_value_heads": 3}
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **size, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4}))


LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _llama3():
    # head_dim 16: wavelengths 6.3 (kept, < 64 / 4), 32.8 (blended) and the rest (> 64, scaled).
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{**SIZE, "max_position_embeddings": 128}, tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE))


ROPE = {"rope_type": "default", "rope_theta": 1e4}


def _qwen3(window=False):
    # head_dim 24 while hidden_size / heads = 16; with a window: layer 0 global, layers 1-2 sliding
    size = {**SIZE, "num_hidden_layers": 3} if window else SIZE
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **size, head_dim=24, tie_word_embeddings=True, use_sliding_window=window, sliding_window=WINDOW,
        max_window_layers=1, rope_parameters={"rope_type": "default", "rope_theta": 1e6}))


def _gemma2():
    # layers 0 and 2 slide, 1 is global; scores scaled by 24 ** -0.5 (not head_dim 16's), capped at
    # 50, logits at 30 (Gemma2Config's defaults)
    return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **{**SIZE, "num_hidden_layers": 3}, head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24,
        rope_parameters=ROPE))


# Gemma 3 runs on transformers' SDPA path by default: compared with handformer's fused path, which
# computes the same products in the same order (its eager path is compared with ours step by step
# in test_gemma3_attention_paths_equal_transformers_bit_for_bit).
GEMMA3_SIZE = {**SIZE, "attn_implementation": "sdpa"}
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
               "full_attention": {"rope_type": "default", "rope_theta": 1e6}}


def _gemma3():
    # Gemma 3 270M / 1B at tiny width: 4 heads of 256 and 1 key/value head, query_pre_attn_scalar
    # 256, five sliding layers to one global (layer 5 of 7), RoPE bases 1e4 (sliding) and 1e6 (global)
    return transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **{**GEMMA3_SIZE, "num_hidden_layers": 7, "num_key_value_heads": 1}, head_dim=256, sliding_window=WINDOW,
        sliding_window_pattern=6, query_pre_attn_scalar=256, rope_parameters=GEMMA3_ROPE))


def _gemma3_scaled():
    # Gemma 3 4B's RoPE (linear scaling by 8 on the global layers), one layer in two global, a
    # query scale other than head_dim's
    rope = {**GEMMA3_ROPE, "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}
    return transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **{**GEMMA3_SIZE, "num_hidden_layers": 4}, head_dim=32, sliding_window=WINDOW, sliding_window_pattern=2,
        query_pre_attn_scalar=24, rope_parameters=rope))


def _smollm3():
    # no_rope_layer_interval 4: layer 3 has no RoPE
    return transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(
        **{**SIZE, "num_hidden_layers": 4}, rope_parameters={"rope_type": "default", "rope_theta": 2e6}))


def _olmo2():
    return transformers.Olmo2ForCausalLM(transformers.Olmo2Config(**SIZE, rope_parameters=ROPE))


PHI4_ORIGINAL = 16  # Phi-4-mini's original_max_position_embeddings (4096), scaled down


def _phi4_mini():
    # RoPE on 12 of each head's 16 dims (partial_rotary_factor 0.75), LongRoPE with 6 factors a set
    rope = {"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + 0.1 * i for i in range(6)], "long_factor": [1.5 + 0.7 * i for i in range(6)]}
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZE, tie_word_embeddings=True, original_max_position_embeddings=PHI4_ORIGINAL,
        partial_rotary_factor=0.75, rope_parameters=rope))


MOE = dict(num_experts_per_tok=2, rope_parameters=ROPE)


def _mixtral():
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(**SIZE, num_local_experts=4, **MOE))


def _qwen3_moe():
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        **SIZE, num_experts=4, moe_intermediate_size=32, norm_topk_prob=True, **MOE))


def _qwen2_moe():
    return transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        **SIZE, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=48, **MOE))


def _olmoe():
    return transformers.OlmoeForCausalLM(transformers.OlmoeConfig(**SIZE, num_experts=4, **MOE))


# YaRN 4 times over an original context of 16 (gpt-oss: 32 times over 4096), truncate false as gpt-oss's
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 16}


def _gpt_oss():
    # layers 0 and 2 slide, 1 is global; heads of 12; 5 experts, 2 a token; the SwiGLU clamped at 1.5
    # (released: 7) so that the clamp bites at these weights
    return transformers.GptOssForCausalLM(transformers.GptOssConfig(
        **{**SIZE, "num_hidden_layers": 3}, head_dim=12, num_local_experts=5, num_experts_per_tok=2,
        sliding_window=WINDOW, swiglu_limit=1.5, rope_parameters=GPT_OSS_ROPE))


# Today's open families at odd sizes: 6 heads of 12 (2 key/value heads) over a width of 78
ODD78 = {**SIZE, "hidden_size": 78, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 12,
       "intermediate_size": 86, "num_hidden_layers": 3}


def _seed_oss():  # biases on q, k, v only (Seed-OSS-36B's)
    return transformers.SeedOssForCausalLM(transformers.SeedOssConfig(
        **ODD78, attention_bias=True, attention_out_bias=False, mlp_bias=False, rope_parameters=ROPE))


def _olmo3():  # layers 0-2 and 4 slide, 3 is global
    return transformers.Olmo3ForCausalLM(transformers.Olmo3Config(
        **{**ODD78, "num_hidden_layers": 5}, sliding_window=WINDOW,
        rope_parameters={kind: {"rope_type": "default", "rope_theta": 5e5}
                         for kind in ("sliding_attention", "full_attention")}))


def _hunyuan():  # q/k norms after RoPE; NTK RoPE with alpha 1000 (Hunyuan 7B's): base 1e4 * 1000^(12/10)
    return transformers.HunYuanDenseV1ForCausalLM(transformers.HunYuanDenseV1Config(
        **ODD78, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "alpha": 1000.0, "factor": 1.0}))


def _ernie4_5():  # RoPE on adjacent pairs; biases on every linear layer (use_bias)
    return transformers.Ernie4_5ForCausalLM(transformers.Ernie4_5Config(**ODD78, use_bias=True, rope_parameters=ROPE))


# DeepSeek-V3 at odd sizes: 3 heads of 10 + 6 dims (RoPE on the 6, interleaved), values 12 wide, a
# key/value latent of 14 and a query latent of 18; layer 0 dense, then 8 experts in 4 groups, 3 of
# them from the best 2 groups, 2 shared experts; YaRN with DeepSeek's mscale on the softmax scale
DEEPSEEK_ROPE = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 16,
                 "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}


def _deepseek_v3():
    size = {**SIZE, "hidden_size": 60, "num_attention_heads": 3, "num_key_value_heads": 3, "intermediate_size": 88,
            "num_hidden_layers": 3}
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        **size, moe_intermediate_size=20, first_k_dense_replace=1, n_routed_experts=8, n_group=4, topk_group=2,
        num_experts_per_tok=3, n_shared_experts=2, routed_scaling_factor=2.5, kv_lora_rank=14, q_lora_rank=18,
        qk_nope_head_dim=10, qk_rope_head_dim=6, v_head_dim=12, rope_parameters=DEEPSEEK_ROPE))
    with torch.no_grad():  # the correction biases change which experts are chosen
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.3)
    return model


BUILDERS = {"qwen2": _qwen2, "mistral_window": lambda: _mistral(WINDOW), "mistral_no_window": lambda: _mistral(None),
            "gemma": _gemma, "phi3": _phi3, "smollm": _smollm, "llama3": _llama3,
            "qwen3": _qwen3, "qwen3_window": lambda: _qwen3(window=True), "gemma2": _gemma2, "gemma3": _gemma3,
            "gemma3_scaled": _gemma3_scaled, "smollm3": _smollm3, "olmo2": _olmo2, "phi4_mini": _phi4_mini,
            "mixtral": _mixtral, "qwen3_moe": _qwen3_moe, "qwen2_moe": _qwen2_moe, "olmoe": _olmoe,
            "gpt_oss": _gpt_oss, "deepseek_v3": _deepseek_v3}
BUILDERS.update(seed_oss=_seed_oss, olmo3=_olmo3, hunyuan=_hunyuan, ernie4_5=_ernie4_5)
# The families whose attention is a variant of the lesson's (handformer.families), never fused
VARIANT_ATTENTION = ("gemma2", "gemma3", "gemma3_scaled", "olmo2", "olmoe", "gpt_oss", "olmo3", "hunyuan",
                     "deepseek_v3")

# The open families of 2025-26, on odd sizes: 6 heads of 10 over a width of 60, 3 layers.
ODD = {**SIZE, "hidden_size": 60, "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 86,
       "num_hidden_layers": 3}
GRANITE = dict(embedding_multiplier=12.0, attention_multiplier=0.03125, residual_multiplier=0.22, logits_scaling=1.5)


def _granite():
    return transformers.GraniteForCausalLM(transformers.GraniteConfig(**ODD, **GRANITE, rope_parameters=ROPE))


BUILDERS["granite"] = _granite
VARIANT_ATTENTION += ("granite",)


def _apertus():  # q/k norms per head, a plain xIELU MLP (its alphas randomized too), Llama 3 scaling
    rope = {**LLAMA3_ROPE, "original_max_position_embeddings": 16}
    return transformers.ApertusForCausalLM(transformers.ApertusConfig(**ODD78, rope_parameters=rope))


BUILDERS["apertus"] = _apertus

# YaRN 8 times over an original context of 8 (Ministral 3: 16 times over 16,384), cos and sin unscaled
# (mscale = mscale_all_dim = 1); queries times 1 + 0.5 ln(1 + floor(position / 8)) (released: beta 0.1)
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0, "original_max_position_embeddings": 8,
                   "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "llama_4_scaling_beta": 0.5}


def _ministral3():  # the query scale changes at positions 8, 16 and 24; a window on every layer
    return transformers.Ministral3ForCausalLM(transformers.Ministral3Config(
        **ODD78, sliding_window=WINDOW, rope_parameters=MINISTRAL3_ROPE))


BUILDERS["ministral3"] = _ministral3
VARIANT_ATTENTION += ("ministral3",)


def _olmo3_yarn():  # the long-context checkpoints': YaRN (8 over 8, attention factor 1.2) on the global layer only
    full = {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "original_max_position_embeddings": 8,
            "attention_factor": 1.2079441541679836, "beta_fast": 32.0, "beta_slow": 1.0}
    return transformers.Olmo3ForCausalLM(transformers.Olmo3Config(
        **{**ODD78, "num_hidden_layers": 4}, sliding_window=WINDOW,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 5e5}, "full_attention": full}))


BUILDERS["olmo3_yarn"] = _olmo3_yarn
VARIANT_ATTENTION += ("olmo3_yarn",)


def _qwen3_5():
    # 3 heads of 24 (RoPE on 6 of them) and 1 key/value head; gated DeltaNet in layers 0, 2 and 3 with
    # 2 query/key heads of 6, 4 value heads of 10 and a convolution over 3 positions
    return transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(
        **{**ODD, "num_attention_heads": 3, "num_key_value_heads": 1, "num_hidden_layers": 4}, head_dim=24,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=6, linear_value_head_dim=10,
        linear_conv_kernel_dim=3, rope_parameters={**ROPE, "partial_rotary_factor": 0.25},
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"]))


BUILDERS["qwen3_5"] = _qwen3_5
VARIANT_ATTENTION += ("qwen3_5",)
def _glm4():  # four norms a block; RoPE on 6 of each head's 12 dims, adjacent pairs; q/k/v biases; fused gate/up
    return transformers.Glm4ForCausalLM(transformers.Glm4Config(
        **ODD78, attention_bias=True, rope_parameters={**ROPE, "partial_rotary_factor": 0.5}))


BUILDERS["glm4"] = _glm4


def _exaone4():  # norms after the sublayers, q/k norms per head; layers 0-2 and 4 slide, 3 global without RoPE
    return transformers.Exaone4ForCausalLM(transformers.Exaone4Config(
        **{**ODD78, "num_hidden_layers": 5}, sliding_window=WINDOW, sliding_window_pattern=4, rope_parameters=ROPE))


BUILDERS["exaone4"] = _exaone4


@functools.cache
def _imported(name):
    """The family's tiny random transformers model and its import, built once for the module (the
    tests read them; one that changes a model changes a copy)."""
    torch.manual_seed(sorted(BUILDERS).index(name))
    hf_model = randomize_hf(BUILDERS[name](), 0.15)
    hf_model.generation_config.eos_token_id = None  # no early stop: compare every token
    return hf_model, model_from_hf(hf_model.config.to_dict(), hf_model.state_dict()).eval()


@pytest.fixture(scope="module", params=list(BUILDERS))
def pair(request):
    return request.param, *_imported(request.param)


HF_GREEDY: dict[tuple[str, bool], list[list[int]]] = {}


def _hf_greedy(name, hf_model, use_cache: bool) -> list[list[int]]:
    """transformers' 20 greedy tokens for the left-padded batch of prompts of 9, 4 and 6 tokens
    (with or without its KV cache), generated once a family for the tests that compare with them."""
    if (name, use_cache) not in HF_GREEDY:
        ids, mask = _left_padded([9, 4, 6], 9, seed=3)
        out = hf_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0,
                                use_cache=use_cache)
        HF_GREEDY[name, use_cache] = out[:, ids.size(1):].tolist()
    return HF_GREEDY[name, use_cache]


def _left_padded(lengths, total, seed=1):
    ids = torch.randint(3, VOCAB, (len(lengths), total), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, total - n:] = 1
    return ids * mask, mask


# transformers' gated DeltaNet (Qwen3.5's linear attention) and ours both run the recurrence a chunk at a
# time, but build a chunk's corrections in another order (its row-by-row update of the triangular system):
# the fp32 sums differ, and on an Intel Xeon the logits (up to 10) part by 1.7e-5 (under 1e-5 on an AMD
# EPYC). For it the tolerance is 1e-5 of the logits' scale (docs/proof.md)
CHUNKED_RECURRENCE = ("qwen3_5",)


def _assert_logits_close(name: str, got: torch.Tensor, expected: torch.Tensor) -> None:
    scale = max(1.0, float(expected.abs().max())) if name in CHUNKED_RECURRENCE else 1.0
    torch.testing.assert_close(got, expected, atol=1e-5 * scale, rtol=1e-5)


@torch.no_grad()
def test_logits_match_at_every_position(pair):
    name, hf_model, ours = pair
    ids = torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(2))  # 4.8 windows
    expected = hf_model(ids).logits
    assert expected.std() > 0.5  # far from trivial, so 1e-5 agreement means something
    _assert_logits_close(name, ours(ids).logits, expected)


@torch.no_grad()
def test_logits_match_with_left_padding(pair):
    name, hf_model, ours = pair
    ids, mask = _left_padded([20, 13, 7], 20)
    real = mask.bool()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    expected = hf_model(ids, attention_mask=mask, position_ids=position_ids).logits
    got = ours(ids, attention_mask=mask).logits
    _assert_logits_close(name, got[real], expected[real])


@torch.no_grad()
def test_greedy_generation_matches_batched_and_left_padded(pair):
    """Prompts of 9, 4 and 6 tokens continued by 20 tokens (several windows past the prompt), in one
    left-padded batch, with the KV cache (rolling for the sliding-window layers) and without, each
    against Hugging Face's own. Phi-4-mini's decode crosses its original context (16 positions):
    LongRoPE's long factors turn every position from there, so the cached decode computes them all
    again at that step, as transformers' generate does."""
    name, hf_model, ours = pair
    ids, mask = _left_padded([9, 4, 6], 9, seed=3)
    new = 20
    expected = {use_cache: _hf_greedy(name, hf_model, use_cache) for use_cache in (True, False)}
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    assert generate(ours, prompts, new, temperature=0) == expected[True]
    assert generate(ours, prompts, new, temperature=0, use_cache=False) == expected[False]
    assert len({tuple(t) for t in expected[True]}) == 3  # the rows differ: padding cannot hide a mix-up
    assert expected[True] == expected[False]
    assert name != "phi4_mini" or 9 + new > PHI4_ORIGINAL


@torch.no_grad()
def test_prepared_model_generates_the_same(pair):
    """What `handformer generate` runs: the model fused (one Q/K/V and one gate/up matrix; the
    families' attention variants stay unfused) and, here with every size allowed, packed for oneDNN;
    the same 20 greedy tokens as Hugging Face."""
    name, hf_model, ours = pair
    prepared = prepare_for_decoding(copy.deepcopy(ours))
    pack_linears(prepared, min_bytes=0)
    assert any(isinstance(m, FusedSelfAttention) for m in prepared.modules()) == (name not in VARIANT_ATTENTION)
    ids, mask = _left_padded([9, 4, 6], 9, seed=3)
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    assert generate(prepared, prompts, 20, temperature=0) == _hf_greedy(name, hf_model, use_cache=True)
    plain = ours(ids, attention_mask=mask).logits[mask.bool()]
    # oneDNN's packed products sum in another order: within 1e-5 of the logits' scale (Gemma 3's
    # heads of 256 over seven layers move the last bits of logits near 8 by up to 3e-5)
    torch.testing.assert_close(prepared(ids, attention_mask=mask).logits[mask.bool()], plain,
                               atol=1e-5 * max(1.0, float(plain.abs().max())), rtol=1e-5)


def _serve(model, rows, engine=None):
    """Rows joining serve's engine (compact: a finished row leaves at the next step) two and four
    steps after the first ones, the cache regrouped at every join and leave."""
    engine = engine or Engine(model, compact=True)
    engine.add(rows[:2])
    engine.step()
    engine.step()
    engine.add(rows[2:3])
    engine.step()
    engine.step()
    engine.add(rows[3:])
    engine.run()
    return engine


SERVED = ((9, 10), (4, 12), (14, 4), (6, 10))  # (prompt length, new tokens) of each row
GREEDY = SamplingOptions(temperature=0)


@torch.no_grad()
@pytest.mark.parametrize("name", ["qwen3_window", "gemma2", "gemma3", "gpt_oss", "olmo3", "deepseek_v3", "qwen3_5",
                                  "exaone4"])
def test_served_rows_of_mixed_sliding_and_global_layers_get_transformers_tokens(name):
    """serve's batch (rows join and leave, the KV cache regrouped each time) of a model whose
    sliding layers roll over the window while its global layers keep every column, or (DeepSeek-V3)
    whose cache holds latents and RoPE keys of two widths: each row's greedy tokens are
    transformers' for its prompt alone."""
    hf_model, ours = _imported(name)
    g = torch.Generator().manual_seed(5)
    rows = [Row(torch.randint(3, VOCAB, (n,), generator=g).tolist(), new, GREEDY) for n, new in SERVED]
    engine = _serve(ours, rows)
    assert engine.rows == [] and engine.largest_batch >= 3
    for row in rows:
        out = hf_model.generate(torch.tensor([row.prompt]), do_sample=False, max_new_tokens=row.max_new_tokens,
                                pad_token_id=0)
        assert row.tokens == out[0, len(row.prompt):].tolist()


@pytest.mark.parametrize("name", ["seed_oss", "olmo3", "hunyuan", "ernie4_5", "exaone4"])
def test_lora_targets_of_todays_families_are_their_checkpoints_projections(name):
    """LoRA on every linear layer of a block (the variants' attention included) adapts the
    projections the checkpoint names: a peft adapter's module names are handformer's."""
    from handformer.adapters.lora import LoRAConfig, add_lora

    hf_model, ours = _imported(name)
    ours = copy.deepcopy(ours)
    names = add_lora(ours, LoRAConfig(rank=2, targets="all-linear"))
    assert {n.rsplit(".", 1)[-1] for n in names} == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                     "up_proj", "down_proj"}
    hf_names = {k.removeprefix("model.").replace(".mlp.", ".ffn.").removesuffix(".weight")
                for k in hf_model.state_dict()}
    assert len(names) == 7 * ours.cfg.n_layers and set(names) <= hf_names


@torch.no_grad()
def test_served_longrope_rows_run_every_position_again_when_the_factors_change():
    """Phi-4-mini in serve's batch: the longest row passes the original context (16) while others
    join and leave, so the batch turns to the long factors, and back to the short ones once the
    long rows have left. Each change runs every position again: the cached batch gives the tokens
    of the same batch recomputed from scratch at every step."""
    _, ours = _imported("phi4_mini")
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n, _ in SERVED]
    tokens, sets = {}, []

    class Recording(Engine):
        def step(self):
            choices = super().step()
            sets.append(self.long_keys)  # the set the cached keys were turned with
            return choices

    for use_cache in (True, False):
        rows = [Row(p, new, GREEDY) for p, (_, new) in zip(prompts, SERVED)]
        _serve(ours, rows, engine=Recording(ours, compact=True, use_cache=use_cache))
        tokens[use_cache] = [row.tokens for row in rows]
    assert tokens[True] == tokens[False]
    sets = sets[:len(sets) // 2]  # the cached run's
    assert sets[0] is False and True in sets and False in sets[sets.index(True):]  # there and back


@torch.no_grad()
def test_a_longrope_chat_runs_every_position_again_when_the_factors_change():
    """A chat's KV cache lives across turns: a turn whose prompt passes the original context runs
    the whole prompt again with the long factors, and a later, shorter one (a conversation cut to
    fit) with the short ones; each turn's tokens are those of its prompt generated alone."""
    from handformer.data.tokenizer import Tokenizer
    from handformer.generation.chat import ChatSession
    from handformer.generation.chat_template import ChatTemplate

    _, ours = _imported("phi4_mini")
    tokenizer = Tokenizer.train_char(["abc"])
    session = ChatSession(ours, tokenizer, ChatTemplate("{{ messages }}", {}), [2], sampling=GREEDY,
                          max_new_tokens=6)
    g = torch.Generator().manual_seed(7)
    first = torch.randint(3, VOCAB, (10,), generator=g).tolist()
    second = first + torch.randint(3, VOCAB, (9,), generator=g).tolist()  # 19 > 16: the long factors
    third = second[:5] + torch.randint(3, VOCAB, (6,), generator=g).tolist()  # 11: the short ones again
    for prompt in (first, second, third):
        tokens = session._generate(prompt, None)
        assert tokens == generate(ours, [prompt], 6, temperature=0, stop_tokens=[2])[0]
    assert session.cache.length == len(third) + 5


def test_configs_carry_each_familys_variation(pair):
    name, hf_model, ours = pair
    cfg = ours.cfg
    assert cfg.position == "rope" and cfg.dropout == 0.0
    assert cfg.norm_placement == {"gemma2": "sandwich", "gemma3": "sandwich", "gemma3_scaled": "sandwich",
                                  "olmo2": "reordered", "olmo3": "reordered", "glm4": "sandwich",
                                  "exaone4": "reordered", "olmo3_yarn": "reordered"}.get(name, "pre")
    expected = {
        "qwen2": dict(qkv_bias=True, bias=False, tie_embeddings=True, rope_theta=1e6, norm_eps=1e-6,
                      sliding_window=None),
        "mistral_window": dict(sliding_window=WINDOW, bias=False, qkv_bias=False, tie_embeddings=False),
        "mistral_no_window": dict(sliding_window=None),
        "gemma": dict(head_dim=24, n_kv_heads=1, norm="rmsnorm_offset", activation="geglu_tanh",
                      scale_embeddings=True, tie_embeddings=True),
        "phi3": dict(sliding_window=WINDOW, tie_embeddings=False, activation="swiglu", norm_eps=1e-5),
        "smollm": dict(n_heads=9, n_kv_heads=3, head_dim=8, tie_embeddings=True),
        "llama3": dict(rope_theta=5e5),
        "qwen3": dict(qk_norm="head", head_dim=24, bias=False, qkv_bias=False, tie_embeddings=True,
                      sliding_window=None),
        "qwen3_window": dict(qk_norm="head", sliding_window=WINDOW, global_layers=[0]),
        "gemma2": dict(norm_placement="sandwich", norm="rmsnorm_offset", attn_scale_dim=24, attn_softcap=50.0,
                       logit_softcap=30.0, sliding_window=WINDOW, global_layers=[1], tie_embeddings=True),
        "gemma3": dict(norm_placement="sandwich", qk_norm="head", head_dim=256, attn_scale_dim=256,
                       sliding_window=WINDOW, global_layers=[5], rope_theta=1e6, rope_local_theta=1e4,
                       rope_scaling=None, attn_softcap=None, logit_softcap=None, scale_embeddings=True),
        "gemma3_scaled": dict(global_layers=[1, 3], rope_scaling=LinearRopeScaling(8.0), attn_scale_dim=24),
        "smollm3": dict(nope_layers=[3], tie_embeddings=True, rope_theta=2e6),
        "olmo2": dict(norm_placement="reordered", qk_norm="width", norm_eps=1e-5, tie_embeddings=False),
        "phi4_mini": dict(rope_fraction=0.75, tie_embeddings=True),
        "mixtral": dict(moe=MoEConfig(4, 2, None, True, 0, 0.001), n_kv_heads=2, d_ff=96),
        "qwen3_moe": dict(moe=MoEConfig(4, 2, 32, True, 0, 0.001), qk_norm="head"),
        "qwen2_moe": dict(moe=MoEConfig(4, 2, 32, False, 48, 0.001), qkv_bias=True),
        "olmoe": dict(moe=MoEConfig(4, 2, None, False, 0, 0.01), qk_norm="width", d_ff=96),
        "granite": dict(family=FamilyConfig(**GRANITE), d_model=60, head_dim=10, n_kv_heads=2, d_ff=86),
        "gpt_oss": dict(moe=MoEConfig(5, 2, None, True, 0, 0.001), attn_sinks=True, swiglu_limit=1.5,
                        swiglu_alpha=1.702, bias=True, head_dim=12, sliding_window=WINDOW, global_layers=[1],
                        rope_scaling=YarnRopeScaling(4.0, 16, 32.0, 1.0, False)),
        "olmo3": dict(qk_norm="width", sliding_window=WINDOW, global_layers=[3], rope_theta=5e5, head_dim=12),
        "hunyuan": dict(qk_norm="head_after_rope", rope_theta=1e4 * 1000.0 ** (12 / 10), norm_eps=1e-5),
        "ernie4_5": dict(bias=True, tie_embeddings=True, head_dim=12, norm_eps=1e-5),
        "seed_oss": dict(qkv_bias=True, bias=False, head_dim=12, d_model=78, tie_embeddings=False),
        "deepseek_v3": dict(moe=MoEConfig(8, 3, 20, True, 40, 0.001, "sigmoid", 4, 2, 2.5, 1, False),
                            mla=MLAConfig(14, 18, 10, 12, True), head_dim=6, n_kv_heads=None, d_ff=88,
                            rope_scaling=YarnRopeScaling(factor=4.0, original_max_positions=16, mscale=0.707,
                                                         mscale_all_dim=1.0)),
        "apertus": dict(activation="xielu", qk_norm="head", head_dim=12, bias=False, norm_eps=1e-5,
                        rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 16)),
        "qwen3_5": dict(norm="rmsnorm_offset", qk_norm="head", rope_fraction=0.25, head_dim=24, n_kv_heads=1,
                        family=FamilyConfig(attn_output_gate=True), deltanet=DeltaNetConfig([0, 2, 3], 2, 4, 6, 10, 3)),
        "glm4": dict(norm_placement="sandwich", rope_fraction=0.5, qkv_bias=True, bias=False, head_dim=12,
                     tie_embeddings=False),
        "exaone4": dict(qk_norm="head", sliding_window=WINDOW, global_layers=[3], nope_layers=[3], head_dim=12),
        "ministral3": dict(family=FamilyConfig(query_scale_beta=0.5, query_scale_positions=8), sliding_window=WINDOW,
                           rope_scaling=YarnRopeScaling(8.0, 8, mscale=1.0, mscale_all_dim=1.0), rope_theta=1e6),
        "olmo3_yarn": dict(rope_theta=5e5, rope_local_theta=5e5, global_layers=[3], norm_placement="reordered",
                           rope_scaling=YarnRopeScaling(8.0, 8, attention_factor=1.2079441541679836)),
    }[name]
    assert {k: getattr(cfg, k) for k in expected} == expected
    if name == "smollm":
        assert ours.layers[0].self_attn.k_proj.weight.shape == (3 * 8, 72)  # GQA: 3 key/value heads
    if name == "phi3":  # the fused projections were split: q, k, v rows, then gate, up rows
        layer = hf_model.model.layers[0]
        fused = torch.cat([ours.layers[0].self_attn.q_proj.weight, ours.layers[0].self_attn.k_proj.weight,
                           ours.layers[0].self_attn.v_proj.weight])
        assert torch.equal(fused, layer.self_attn.qkv_proj.weight)
        assert torch.equal(torch.cat([ours.layers[0].ffn.gate_proj.weight, ours.layers[0].ffn.up_proj.weight]),
                           layer.mlp.gate_up_proj.weight)


@torch.no_grad()
@pytest.mark.parametrize("name", ["gemma3", "gemma3_scaled"])
def test_gemma3_attention_paths_equal_transformers_bit_for_bit(name):
    """Heads of 256 over seven layers make the two ways of computing attention differ in their last
    bits (up to 3e-5 in the logits): handformer's fused path equals transformers' SDPA path exactly,
    and its formula step by step (the path that returns weights) equals transformers' eager one."""
    torch.manual_seed(sorted(BUILDERS).index(name))
    hf_model = randomize_hf(BUILDERS[name](), 0.15)
    ours = model_from_hf(hf_model.config.to_dict(), hf_model.state_dict()).eval()
    ids = torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(2))
    assert torch.equal(ours(ids).logits, hf_model(ids).logits)
    hf_model.set_attn_implementation("eager")
    assert torch.equal(ours(ids, need_weights=True).logits, hf_model(ids).logits)


def test_longrope_and_partial_rope_frequencies_equal_hugging_faces():
    """Phi-4-mini's RoPE: transformers' longrope inverse frequencies of both sets (short within the
    original context, long past it) and its attention factor, bit for bit; the tables turn 12 of
    each head's 16 dims."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = _phi4_mini().config
    short, factor = ROPE_INIT_FUNCTIONS["longrope"](hf_config, "cpu")
    long, _ = ROPE_INIT_FUNCTIONS["longrope"](hf_config, "cpu", seq_len=PHI4_ORIGINAL + 1)
    assert factor == math.sqrt(1 + math.log(64 / 16) / math.log(16))  # max / original positions
    ours = model_from_hf(hf_config.to_dict(), randomize_hf(_phi4_mini(), 0.1).state_dict())
    rotary = ours.rotary
    assert rotary.cos.shape == (PHI4_ORIGINAL, 12) and rotary.long_cos.shape == (64, 12)
    for table, inv_freq, positions in ((rotary.cos, short, PHI4_ORIGINAL), (rotary.long_cos, long, 64)):
        angles = torch.outer(torch.arange(positions).float(), inv_freq)  # (P, 6)
        assert torch.equal(table, torch.cat([angles, angles], dim=-1).cos() * factor)
    assert not torch.equal(short, long)
    within, past = rotary(torch.arange(16)[None]), rotary(torch.arange(17)[None])
    assert torch.equal(within[0][0, 0, 5], rotary.cos[5]) and torch.equal(past[0][0, 0, 5], rotary.long_cos[5])


def test_gemma3_frequencies_equal_hugging_faces():
    """Gemma 3's two RoPEs: the sliding layers' base 1e4, the global layers' 1e6 divided by the
    linear factor 8, as transformers computes them per layer type, bit for bit."""
    hf_model = _gemma3_scaled()
    ours = model_from_hf(hf_model.config.to_dict(), randomize_hf(_gemma3_scaled(), 0.1).state_dict())
    hf_rotary = hf_model.model.rotary_emb
    for kind, module in (("sliding_attention", ours.rotary.sliding_rope), ("full_attention", ours.rotary.global_rope)):
        inv_freq = getattr(hf_rotary, f"{kind}_inv_freq")
        angles = torch.outer(torch.arange(64).float(), inv_freq)
        assert torch.equal(module.cos, torch.cat([angles, angles], dim=-1).cos()), kind
    assert not torch.equal(ours.rotary.sliding_rope.cos, ours.rotary.global_rope.cos)


def test_llama3_frequencies_equal_hugging_faces():
    """The rotary frequencies themselves: Hugging Face's llama3 inverse frequencies, bit for bit."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from handformer.nn.positions import llama3_inv_freq

    hf_config = _llama3().config
    expected, attention_scale = ROPE_INIT_FUNCTIONS["llama3"](hf_config, "cpu")
    assert attention_scale == 1.0
    cfg = config_from_hf(hf_config.to_dict())
    plain = 1.0 / 5e5 ** (torch.arange(0, 16, 2, dtype=torch.int64).float() / 16)  # (Dh/2,)
    inv_freq = llama3_inv_freq(plain, cfg.rope_scaling)
    assert torch.equal(inv_freq, expected)
    assert inv_freq[0] == plain[0] and inv_freq[-1] == plain[-1] / 8  # kept, and slowed by factor
    assert plain[1] / 8 < inv_freq[1] < plain[1]  # blended
    ours = model_from_hf(hf_config.to_dict(), randomize_hf(_llama3(), 0.1).state_dict())
    angles = torch.outer(torch.arange(cfg.max_positions).float(), expected)  # (P, Dh/2)
    assert torch.equal(ours.rotary.cos[:, :8], angles.cos())


# --- refusals: settings handformer does not implement, named by key and value ----------------------

def _hf(builder):
    return builder().config.to_dict()


@pytest.mark.parametrize("change, message", [
    ({"attn_logit_softcapping": 50.0}, "mistral config has attn_logit_softcapping=50.0: soft-capping of "
     "attention scores (Gemma 2) is not implemented in handformer for mistral (only for gemma2, gemma3_text)"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping=30.0: soft-capping of the output logits"),
    ({"layer_types": ["sliding_attention", "full_attention"]},
     "layer_types=['sliding_attention', 'full_attention']: layers that alternate"),
    ({"use_qk_norm": True}, "use_qk_norm=True: normalising queries and keys"),
    ({"num_local_experts": 8}, "num_local_experts=8: mixture-of-experts"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5: rotary embeddings on part of each head"),
    ({"no_rope_layers": [1, 0]}, "no_rope_layers=[1, 0]: layers without rotary embeddings is not implemented "
     "in handformer for mistral (only for smollm3)"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
     "rope scaling type 'yarn' is not implemented"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0], "long_factor": [1.0]}},
     "rope scaling type 'longrope' is not implemented for mistral"),
    ({"model_type": "phi"}, "unsupported model_type 'phi' (Phi-1/2 run attention and the MLP in parallel"),
    ({"model_type": "gemma3"}, "unsupported model_type 'gemma3' (a Gemma 3 with vision"),
])
def test_unimplemented_settings_are_named(change, message):
    with pytest.raises(ValueError) as err:
        config_from_hf({**_hf(lambda: _mistral(WINDOW)), **change})
    assert message in str(err.value)


def test_qwen2_sliding_window_only_when_asked_and_from_max_window_layers_on():
    hf = _hf(_qwen2)
    assert config_from_hf({**hf, "sliding_window": 4096}).sliding_window is None  # use_sliding_window false
    on = {k: v for k, v in hf.items() if k != "layer_types"}
    on.update(use_sliding_window=True, sliding_window=4)
    every = config_from_hf({**on, "max_window_layers": 0})
    assert (every.sliding_window, every.global_layers) == (4, [])
    assert config_from_hf({**on, "max_window_layers": 2}).sliding_window is None  # no layer slides
    mixed = config_from_hf({**on, "max_window_layers": 1})  # layer 0 global, layer 1 slides
    assert (mixed.sliding_window, mixed.global_layers, mixed.mixes_windows) == (4, [0], True)


def test_gemma_activation_and_bias_checks():
    hf = _hf(_gemma)
    assert config_from_hf({**hf, "hidden_act": "gelu_pytorch_tanh"}).activation == "geglu_tanh"
    with pytest.raises(ValueError, match="hidden_act='relu'"):
        config_from_hf({**hf, "hidden_act": "relu"})
    with pytest.raises(ValueError, match="attention_bias=True"):
        config_from_hf({**hf, "attention_bias": True})


def test_gemma_norm_and_embedding_scale_match_in_bfloat16():
    """In bfloat16 Gemma rounds sqrt(d_model) to the dtype (sqrt(3072) -> 55.5) and applies the
    norm's 1 + w gain in float32: the same bits as Hugging Face's modules."""
    from transformers.models.gemma import modeling_gemma

    from handformer.nn.embedding import TokenEmbedding
    from handformer.nn.norms import OffsetRMSNorm

    torch.manual_seed(0)
    hf_embed = modeling_gemma.GemmaTextScaledWordEmbedding(7, 3072, 0, embed_scale=3072 ** 0.5).bfloat16()
    ours = TokenEmbedding(7, 3072, scale=True).bfloat16()
    ours.weight.data.copy_(hf_embed.weight.data)
    ids = torch.tensor([[1, 5, 6]])
    assert torch.equal(ours(ids), hf_embed(ids))
    hf_norm, norm = modeling_gemma.GemmaRMSNorm(64, eps=1e-6), OffsetRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        hf_norm.weight.normal_()
        norm.weight.copy_(hf_norm.weight)
    x = (3 * torch.randn(2, 5, 64)).bfloat16()
    assert torch.equal(norm(x), hf_norm(x))


# A family's second or third released size repeats the proof of its first (the same layers, more of
# them and wider): those run with -m slow (docs/proof.md lists them).
LARGER_SIZE = pytest.mark.slow


@pytest.mark.parametrize("config_class, overrides", [
    ("Qwen2Config", {"tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 131072}),
    ("MistralConfig", {}),  # Mistral 7B: 4096-token window, 8 key/value heads
    ("GemmaConfig", {}),  # Gemma 7B: 16 heads of 256 for hidden_size 3072
    ("Phi3Config", {"sliding_window": 2047}),  # Phi-3 mini 4k
    ("LlamaConfig", {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
                     "intermediate_size": 1536, "num_hidden_layers": 30, "vocab_size": 49152,
                     "tie_word_embeddings": True}),  # SmolLM2 135M's shape
    ("LlamaConfig", {"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "intermediate_size": 8192, "num_hidden_layers": 16, "vocab_size": 128256,
                     "tie_word_embeddings": True, "max_position_embeddings": 1024,
                     "rope_parameters": {**LLAMA3_ROPE, "factor": 32.0, "original_max_position_embeddings": 8192}}),

    ("Qwen3Config", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                     "intermediate_size": 3072, "num_hidden_layers": 28, "vocab_size": 151936,
                     "tie_word_embeddings": True}),  # Qwen3 0.6B
    ("Gemma2Config", {}),  # Gemma 2 2B
    ("Gemma3TextConfig", {"hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
                          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                          "vocab_size": 262144, "sliding_window": 512}),  # Gemma 3 270M
    pytest.param("Gemma3TextConfig", {"hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
                                      "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                                      "vocab_size": 262144, "sliding_window": 512}, marks=LARGER_SIZE),  # Gemma 3 1B
    ("SmolLM3Config", {}),  # SmolLM3 3B
    ("Olmo2Config", {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 16, "vocab_size": 100352}),  # OLMo 2 1B
    ("Phi3Config", {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                    "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 200064,
                    "tie_word_embeddings": True, "max_position_embeddings": 131072,
                    "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75,
                    "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "partial_rotary_factor": 0.75,
                                        "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}}),  # Phi-4-mini
    ("MixtralConfig", {"num_hidden_layers": 2}),  # Mixtral 8x7B's layers, two of them
    ("Qwen3MoeConfig", {"num_hidden_layers": 2, "num_experts": 128, "num_experts_per_tok": 8,
                        "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4,
                        "head_dim": 128}),  # Qwen3-30B-A3B's layers, two of them
    ("Qwen2MoeConfig", {"num_hidden_layers": 2}),  # Qwen1.5-MoE-A2.7B's layers, two of them
    ("OlmoeConfig", {"num_hidden_layers": 2}),  # OLMoE-1B-7B's layers, two of them
    ("GraniteConfig", {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
                       "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 49155,
                       "tie_word_embeddings": True, **GRANITE, "attention_multiplier": 0.015625}),  # Granite 3.1 2B
    ("SeedOssConfig", {"hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64,
                       "num_attention_heads": 80, "num_key_value_heads": 8, "head_dim": 128,
                       "vocab_size": 155136}),  # Seed-OSS-36B
    ("Olmo3Config", {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "vocab_size": 100278}),  # OLMo 3 7B
    ("HunYuanDenseV1Config", {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                              "vocab_size": 128167, "tie_word_embeddings": True}),  # Hunyuan 7B
    ("Ernie4_5Config", {}),  # ERNIE-4.5-0.3B
    ("ApertusConfig", {"hidden_size": 4096, "intermediate_size": 21504, "num_hidden_layers": 32,
                       "num_attention_heads": 32, "num_key_value_heads": 8}),  # Apertus-8B
    pytest.param("ApertusConfig", {"hidden_size": 8192, "intermediate_size": 43008, "num_hidden_layers": 80,
                                   "num_attention_heads": 64, "num_key_value_heads": 8},
                 marks=LARGER_SIZE),  # Apertus-70B
    ("Qwen3_5TextConfig", {"hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64,
                           "num_attention_heads": 24, "linear_num_value_heads": 48, "vocab_size": 248320,
                           "max_position_embeddings": 262144}),  # Qwen3.5-27B's text model
    ("Glm4Config", {"max_position_embeddings": 32768}),  # GLM-4-9B-0414
    pytest.param("Glm4Config", {"hidden_size": 6144, "intermediate_size": 23040, "num_hidden_layers": 61,
                                "num_attention_heads": 48, "attention_bias": False, "rms_norm_eps": 1e-5},
                 marks=LARGER_SIZE),  # GLM-4-32B-0414
    ("Exaone4Config", {"hidden_size": 2048, "intermediate_size": 4096, "num_hidden_layers": 30,
                       "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "sliding_window": None,
                       "layer_types": ["full_attention"] * 30, "tie_word_embeddings": True}),  # EXAONE-4.0-1.2B
    pytest.param("Exaone4Config", {"hidden_size": 5120, "intermediate_size": 27392, "num_hidden_layers": 64,
                                   "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128},
                 marks=LARGER_SIZE),  # EXAONE-4.0-32B
    ("Ministral3Config", {"hidden_size": 3072, "intermediate_size": 9216, "num_hidden_layers": 26,
                          "tie_word_embeddings": True}),  # Ministral 3 3B's text model
    pytest.param("Ministral3Config", {}, marks=LARGER_SIZE),  # Ministral 3 8B's text model
    pytest.param("Ministral3Config", {"hidden_size": 5120, "intermediate_size": 16384, "num_hidden_layers": 40},
                 marks=LARGER_SIZE),  # 14B's
])
def test_full_size_configs_give_the_same_parameter_count(config_class, overrides):
    """The families at their released sizes (transformers' defaults), built on the meta device: no
    memory, but every shape. Same parameter count as Hugging Face's model, and the weight map fits."""
    from handformer.convert.hf_weights import convert_hf_state_dict
    from handformer.families import build_causal_lm

    hf_config = getattr(transformers, config_class)(**overrides)
    cfg = config_from_hf(hf_config.to_dict())
    with torch.device("meta"):
        hf_model = getattr(transformers, config_class.replace("TextConfig", "Config").replace(
            "Config", "ForCausalLM"))(hf_config)
        ours = build_causal_lm(cfg)
    assert ours.num_parameters() == sum(p.numel() for p in hf_model.parameters())
    state = {k: v for k, v in hf_model.state_dict().items() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    assert convert_hf_state_dict(state, cfg, hf_config.model_type).keys() == ours.state_dict().keys()


@torch.no_grad()
@pytest.mark.parametrize("name", ["granite", "apertus", "glm4", "ministral3", "olmo3_yarn"])
def test_served_rows_and_lora_targets_of_the_open_families(name):
    """serve's batch (rows join and leave) gives each row transformers' greedy tokens for its
    prompt alone; LoRA finds every projection of the family's attention and MLP by its name."""
    from handformer.adapters.lora import LoRAConfig, add_lora

    hf_model, ours = _imported(name)
    g = torch.Generator().manual_seed(5)
    rows = [Row(torch.randint(3, VOCAB, (n,), generator=g).tolist(), new, GREEDY) for n, new in SERVED]
    _serve(ours, rows)
    for row in rows:
        out = hf_model.generate(torch.tensor([row.prompt]), do_sample=False, max_new_tokens=row.max_new_tokens,
                                pad_token_id=0)
        assert row.tokens == out[0, len(row.prompt):].tolist()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    targets = [t for t in targets if t != "gate_proj" or ours.cfg.activation != "xielu"]  # Apertus: not gated
    adapted = add_lora(copy.deepcopy(ours), LoRAConfig(rank=2, alpha=4, targets=targets))
    assert len(adapted) == len(targets) * ours.cfg.n_layers
    assert sorted(add_lora(copy.deepcopy(ours), LoRAConfig(rank=2, targets="all-linear"))) == sorted(adapted)


@pytest.mark.parametrize("name, arch", [("apertus", "apertus"), ("ministral3", "mistral3")])
def test_apertus_and_ministral3_go_to_llama_cpps_apertus_and_mistral3(name, arch):
    """An imported run and a run trained with the family's setting both go to llama.cpp's
    architecture (tests/test_gguf.py writes and reads them); Ministral 3's window, which llama.cpp's
    mistral3 does not slide, is named."""
    from handformer.convert.gguf_arch import family_for, mismatches

    cfg = config_from_hf(_hf(BUILDERS[name]))
    assert family_for(cfg, name).arch == family_for(cfg, None).arch == arch
    expected = [f"sliding_window={WINDOW} (Ministral 3 has no sliding-window attention in llama.cpp)"]
    assert mismatches(cfg, family_for(cfg, name)) == (expected if name == "ministral3" else [])


@pytest.mark.parametrize("family, message", [
    (dict(query_scale_beta=0.1), "family.query_scale_positions=None is invalid: queries scaled by their position need both"),
    (dict(query_scale_beta=-1.0, query_scale_positions=8), "family.query_scale_beta=-1.0 is invalid: it must be a number > 0"),
    (dict(query_scale_beta=0.1, query_scale_positions=0), "family.query_scale_positions=0 is invalid: it must be a positive"),
])
def test_query_scale_settings_are_checked_by_name(family, message):
    from handformer.config import CausalLMConfig

    with pytest.raises(ValueError, match=re.escape(message)):
        CausalLMConfig.llama_style(vocab_size=11, d_model=16, n_heads=2, n_kv_heads=2, d_ff=24, n_layers=1,
                                   family=FamilyConfig(**family))
