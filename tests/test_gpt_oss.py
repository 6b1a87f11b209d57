"""gpt-oss beyond the families' harnesses (tests/test_hf_families.py, tests/test_hf_export.py): its
released MXFP4 experts dequantized on import, YaRN's frequencies, its parameter counts at the released
sizes, LoRA on its router and experts, and what is refused by name (harmony, GGUF)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import randomize_hf, require_module

transformers = require_module("transformers", "pip install -e '.[dev]'")

from handformer.convert.hf_weights import config_from_hf, model_from_hf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

YARN = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 16}


def _tiny(**more):
    # width 64 and experts 32 wide: whole MXFP4 blocks of 32 along both
    config = dict(vocab_size=61, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                  intermediate_size=32, num_hidden_layers=2, num_local_experts=3, num_experts_per_tok=2,
                  max_position_embeddings=64, sliding_window=4, rope_parameters=YARN, swiglu_limit=1.5,
                  attn_implementation="eager", **more)
    torch.manual_seed(0)
    return randomize_hf(transformers.GptOssForCausalLM(transformers.GptOssConfig(**config)), 0.15)


def _by_the_definition(codes, scales):
    """MXFP4 decoded from its definition: each 4-bit code is E2M1 (sign, 2 exponent bits with bias
    1, 1 mantissa bit; exponent 0 is subnormal: 0.5 * m), low nibble first, each block of 32 times
    2^(scale - 127)."""
    nibbles = torch.stack([codes & 0xF, codes >> 4], dim=-1).flatten(-2).long()  # (..., G, 32)
    sign, exponent, mantissa = nibbles >> 3, (nibbles >> 1) & 3, nibbles & 1
    magnitude = torch.where(exponent == 0, 0.5 * mantissa, 2.0 ** (exponent - 1) * (1 + 0.5 * mantissa))
    values = (1 - 2 * sign) * magnitude * 2.0 ** (scales.long()[..., None] - 127)
    return values.flatten(-2)  # (..., rows, G * 32)


@torch.no_grad()
def test_an_mxfp4_checkpoint_imports_as_its_dequantized_weights():
    """A checkpoint whose experts are stored as released gpt-oss stores them (blocks of 4-bit codes
    and a scale a block, written here by hand): imported, its weights are the format's values, and
    the model's logits equal transformers' on those values."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf_model = _tiny()
    state, g = dict(hf_model.state_dict()), torch.Generator().manual_seed(1)
    for name, (rows, cols) in (("gate_up_proj", (64, 64)), ("down_proj", (64, 32))):  # (2F, D) and (D, F)
        for i in range(2):
            key = f"model.layers.{i}.mlp.experts.{name}"
            codes = torch.randint(0, 256, (3, rows, cols // 32, 16), dtype=torch.uint8, generator=g)
            scales = torch.randint(120, 126, (3, rows, cols // 32), dtype=torch.uint8, generator=g)
            dense = _by_the_definition(codes, scales).transpose(1, 2)  # (E, cols, rows), as transformers holds it
            assert torch.equal(dense.bfloat16(), convert_moe_packed_tensors(codes, scales))
            getattr(hf_model.model.layers[i].mlp.experts, name).copy_(dense)
            del state[key]
            state[f"{key}_blocks"], state[f"{key}_scales"] = codes, scales
    ours = model_from_hf(hf_model.config.to_dict(), state).eval()
    expert = ours.layers[1].ffn.experts[2]
    assert torch.equal(expert.down_proj.weight, hf_model.model.layers[1].mlp.experts.down_proj[2].t())
    assert torch.equal(expert.up_proj.weight, hf_model.model.layers[1].mlp.experts.gate_up_proj[2, :, 1::2].t())
    ids = torch.randint(0, 61, (2, 12), generator=g)
    torch.testing.assert_close(ours(ids).logits, hf_model(ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_frequencies_and_factor_equal_transformers(truncate):
    """The released YaRN (32 times over 4096 positions, base 150 000, heads of 64; truncate false,
    and the default true, which rounds the ramp's ends 8.1 and 17.4 to whole dims): transformers'
    inverse frequencies bit for bit, and cos and sin times its attention factor 0.1 ln(32) + 1."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from handformer.nn.positions import yarn_inv_freq

    config = transformers.GptOssConfig()
    config.rope_parameters["truncate"] = truncate
    expected, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    cfg = config_from_hf(config.to_dict())
    assert torch.equal(yarn_inv_freq(64, 150000.0, cfg.rope_scaling), expected)
    assert cfg.rope_scaling.cos_sin_factor() == factor == 0.1 * math.log(32) + 1
    plain = 1.0 / 150000.0 ** (torch.arange(0, 64, 2).float() / 64)
    assert expected[0] == plain[0] and expected[-1] == plain[-1] / 32  # kept, and slowed by factor


@pytest.mark.parametrize("size, layers, experts, total", [
    ("20b", 24, 32, 20_914_757_184), ("120b", 36, 128, 116_829_156_672)])
def test_released_sizes_have_the_published_parameter_counts(size, layers, experts, total):
    """gpt-oss-20b and -120b (model card: 20.91B and 116.83B, transformers' count to the unit) on the
    meta device: one layer and two, every further layer the same as the second."""
    from handformer.families import build_causal_lm

    def count(n_layers):
        config = transformers.GptOssConfig(num_hidden_layers=n_layers, num_local_experts=experts)
        with torch.device("meta"):
            return build_causal_lm(config_from_hf(config.to_dict())).num_parameters()

    one, two = count(1), count(2)
    assert one + (layers - 1) * (two - one) == total


@torch.no_grad()
def test_lora_targets_the_router_and_every_experts_projections():
    """LoRA by name on gpt-oss's router and its experts' biased projections: each layer's router and
    3 x 3 expert projections get an adapter, and the untrained adapters leave the logits as they were."""
    from handformer.adapters.lora import LoRAConfig, add_lora

    hf_model = _tiny()
    ours = model_from_hf(hf_model.config.to_dict(), hf_model.state_dict()).eval()
    ids = torch.randint(0, 61, (1, 10))
    before = ours(ids).logits
    names = add_lora(ours, LoRAConfig(rank=2, targets=["router", "gate_proj", "up_proj", "down_proj"]))
    assert len(names) == 2 * (1 + 3 * 3) and "layers.1.ffn.experts.2.up_proj" in names
    assert "layers.0.ffn.router" in names
    torch.testing.assert_close(ours(ids).logits, before, atol=1e-6, rtol=0)


def test_harmony_is_refused_by_name_in_chat_and_serves_tools():
    """gpt-oss's chat template (harmony: channels, its own tool calls) is refused by name when a
    chat renders it and when serve picks a tool format for it."""
    from handformer.data.tokenizer import Tokenizer
    from handformer.generation.chat_template import ChatTemplate
    from handformer.generation.tool_calls import tool_template

    harmony = ChatTemplate("{% for m in messages %}<|start|>{{ m.role }}<|channel|>final<|message|>"
                           "{{ m.content }}<|end|>{% endfor %}{% if tools %}{{ tools }}{% endif %}")
    with pytest.raises(ValueError, match="harmony format .gpt-oss.: its channels"):
        harmony.render([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="harmony format"):
        tool_template(harmony, Tokenizer.train_char(["abc"]))


def test_gguf_is_refused_by_name_both_ways(tmp_path):
    """llama.cpp's gpt-oss architecture is named in import-gguf's refusal; export-gguf of a run with
    gpt-oss's settings names them."""
    from handformer.convert.gguf_arch import FROM_HF, NOT_YET, family_for, mismatches

    assert FROM_HF["gpt-oss"] == "gpt_oss" and "attention sinks" in NOT_YET["gpt-oss"]
    cfg = config_from_hf(_tiny().config.to_dict())
    with pytest.raises(ValueError, match="imported from model_type 'gpt_oss'"):
        family_for(cfg, "gpt_oss")
    problems = " ".join(mismatches(cfg, family_for(cfg, None)))
    assert "attention sinks" in problems and "clamped SwiGLU" in problems


@torch.no_grad()
def test_int8_model_is_gpt_oss_on_its_int8_weights():
    """`handformer quantize`'s int8 layers reach every linear layer of gpt-oss (attention, router,
    each expert's biased projections, head): the quantized model's logits are those of the float
    model whose weights are replaced by what the int8 values and scales stand for."""
    import copy

    from handformer.inference.quant import dequantize_int8, quantize_int8, quantize_linears

    hf_model = _tiny()
    ours = model_from_hf(hf_model.config.to_dict(), hf_model.state_dict()).eval()
    rounded = copy.deepcopy(ours)
    for module in rounded.modules():
        if isinstance(module, torch.nn.Linear):
            module.weight.copy_(dequantize_int8(*quantize_int8(module.weight)))
    names = quantize_linears(ours, kernel="int8pack-fp32")  # exact sums (the default rounds to bf16)
    assert len(names) == 2 * (4 + 1 + 3 * 3) + 1 and "layers.0.ffn.experts.1.down_proj" in names
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(ours(ids).logits, rounded(ids).logits, atol=1e-5, rtol=1e-5)
