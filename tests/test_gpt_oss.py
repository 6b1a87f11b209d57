"""gpt-oss beyond the families' harnesses (tests/test_hf_families.py, tests/test_hf_export.py): its
released MXFP4 experts dequantized on import, YaRN's frequencies, its parameter counts at the released
sizes, LoRA on its router and experts, what is refused by name (harmony), and llama.cpp's gpt-oss in
GGUF both ways: names, shapes and keys as the gguf package has them, import(export) bit for bit,
MXFP4 experts decoded as gguf decodes them. llama.cpp's own converter and runtime: the slow
tests/test_gguf_llamacpp.py."""

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


# --- llama.cpp's gpt-oss (GGUF) ------------------------------------------------------------------------
HARMONY = "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
TEXT = "to be or not to be, that is the question: whether 'tis nobler in the mind to suffer\n"


def _gguf_tiny():
    """Odd sizes llama.cpp's gpt-oss runs: 3 layers (the last one sliding), heads 12 wide, vocab 61;
    the clamp at 7 and a width of 64, experts 32 wide (whole MXFP4 blocks)."""
    config = dict(vocab_size=61, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                  intermediate_size=32, num_hidden_layers=3, num_local_experts=3, num_experts_per_tok=2,
                  max_position_embeddings=64, sliding_window=4, rope_parameters=YARN, attn_implementation="eager")
    torch.manual_seed(4)
    return randomize_hf(transformers.GptOssForCausalLM(transformers.GptOssConfig(**config)), 0.15)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(transformers' model, the imported run, its GGUF export)."""
    from handformer.cli import main
    from handformer.data.tokenizer import Tokenizer
    from handformer.tasks.lm.imports import import_hf

    tmp = tmp_path_factory.mktemp("gguf")
    hf_model = _gguf_tiny()
    hf_model.save_pretrained(tmp / "hf", safe_serialization=True)
    Tokenizer.train_char([TEXT]).save(tmp / "hf" / "tokenizer.json")
    (tmp / "hf" / "chat_template.jinja").write_text(HARMONY)
    import_hf(tmp / "hf", tmp / "run")
    assert main(["export-gguf", str(tmp / "run"), str(tmp / "m.gguf")]) == 0
    return hf_model, tmp / "run", tmp / "m.gguf"


def _llama_cpps_shapes(E=3, D=64, F=32, V=61, H=4, Hkv=2, Dh=12):
    """llama.cpp's gpt-oss loader's tensors (llama_model_openai_moe::load_arch_tensors; the q/k/v
    biases it reads when present), PyTorch order."""
    per_layer = {"attn_norm.weight": (D,), "post_attention_norm.weight": (D,), "attn_q.weight": (H * Dh, D),
                 "attn_k.weight": (Hkv * Dh, D), "attn_v.weight": (Hkv * Dh, D), "attn_output.weight": (D, H * Dh),
                 "attn_q.bias": (H * Dh,), "attn_k.bias": (Hkv * Dh,), "attn_v.bias": (Hkv * Dh,),
                 "attn_output.bias": (D,), "attn_sinks.weight": (H,), "ffn_gate_inp.weight": (E, D),
                 "ffn_gate_inp.bias": (E,), "ffn_gate_exps.weight": (E, F, D), "ffn_up_exps.weight": (E, F, D),
                 "ffn_down_exps.weight": (E, D, F), "ffn_gate_exps.bias": (E, F), "ffn_up_exps.bias": (E, F),
                 "ffn_down_exps.bias": (E, D)}
    return {"token_embd.weight": (V, D), "output_norm.weight": (D,), "output.weight": (V, D),
            **{f"blk.{i}.{n}": shape for i in range(3) for n, shape in per_layer.items()}}


def test_export_writes_llama_cpps_gpt_oss_tensors_and_keys(exported):
    """The file's tensors are the ones llama.cpp's gpt-oss loads, each a name the gguf package has for
    the architecture, in its shapes; its keys (gguf.Keys' names) hold the run's settings."""
    import gguf

    from handformer.convert.gguf_file import read_gguf
    from handformer.families import gpt_oss

    file = read_gguf(exported[2])
    assert file.architecture == gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GPT_OSS] == "gpt-oss"
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.GPT_OSS]}
    assert {n.rsplit(".", 1)[0].replace("blk.1.", "blk.{bid}.") for n in file.tensors if "blk.1." in n
            or "blk" not in n} == known
    assert {n: t.shape for n, t in file.tensors.items()} == _llama_cpps_shapes()
    k, L, A, R = (lambda key: key.format(arch="gpt-oss")), gguf.Keys.LLM, gguf.Keys.Attention, gguf.Keys.Rope
    expected = {L.CONTEXT_LENGTH: 64, L.EMBEDDING_LENGTH: 64, L.BLOCK_COUNT: 3, L.FEED_FORWARD_LENGTH: 32,
                L.EXPERT_COUNT: 3, L.EXPERT_USED_COUNT: 2, L.EXPERT_FEED_FORWARD_LENGTH: 32, A.HEAD_COUNT: 4,
                A.HEAD_COUNT_KV: 2, A.KEY_LENGTH: 12, A.VALUE_LENGTH: 12, A.LAYERNORM_RMS_EPS: 1e-5,
                A.SLIDING_WINDOW: 4, R.FREQ_BASE: 1e4, R.DIMENSION_COUNT: 12, R.SCALING_TYPE: "yarn",
                R.SCALING_FACTOR: 4.0, R.SCALING_ORIG_CTX_LEN: 16, R.SCALING_YARN_BETA_FAST: 32.0,
                R.SCALING_YARN_BETA_SLOW: 1.0}
    assert {k(key): file.metadata.get(k(key)) for key in expected} == {k(key): v for key, v in expected.items()}
    assert (gpt_oss.WINDOW, gpt_oss.PATTERN, gpt_oss.YARN_ORIGINAL) == (
        k(A.SLIDING_WINDOW), k(A.SLIDING_WINDOW_PATTERN), k(R.SCALING_ORIG_CTX_LEN))
    assert set(gpt_oss.YARN_REFUSED) == {k(R.SCALING_ATTN_FACTOR), k(R.SCALING_YARN_LOG_MUL),
                                        k(R.SCALING_YARN_EXT_FACTOR)}
    assert file.metadata["handformer.rope_scaling.truncate"] is False
    assert file.metadata["tokenizer.chat_template"] == HARMONY


@torch.no_grad()
def test_import_of_the_export_is_the_run_again_with_transformers_logits(exported, tmp_path):
    from handformer.cli import main
    from handformer.tasks.lm.run import load_lm

    hf_model, run_dir, path = exported
    assert main(["import-gguf", str(path), str(tmp_path / "back")]) == 0
    run, back = load_lm(run_dir), load_lm(tmp_path / "back")
    assert back.model.cfg == run.model.cfg and back.config["source"]["model_type"] == "gpt_oss"
    ids = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(5))  # 5 windows past the 4
    logits = back.model(ids).logits
    assert torch.equal(logits, run.model(ids).logits)
    torch.testing.assert_close(logits, hf_model(ids).logits, atol=1e-5, rtol=1e-5)
    assert (tmp_path / "back" / "chat_template.jinja").read_text() == HARMONY


def test_mxfp4_blocks_decode_to_the_bits_gguf_gives():
    """GGML's MXFP4 (llama.cpp's converter repacks gpt-oss's experts so), every exponent byte from the
    subnormal 2^-128 scale to 2^127 (whose larger codes overflow to infinity): gguf's float32 bits."""
    import gguf
    import numpy as np

    from handformer.convert.gguf_quants import dequantize

    raw = np.random.default_rng(6).integers(0, 256, size=(256, 17), dtype=np.uint8)
    raw[:, 0] = np.arange(256)  # one block per exponent
    with np.errstate(over="ignore"):
        expected = gguf.quants.dequantize(raw.reshape(8, -1), gguf.GGMLQuantizationType.MXFP4)
    got = dequantize(torch.from_numpy(raw.reshape(8, -1)), "MXFP4", (8, 1024)).numpy()
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert np.isinf(got).any() and (got[0, :32] != 0).any()  # both ends reached


def _with_mxfp4_experts(src, dst):
    """A copy of a GGUF file whose experts' matrices are MXFP4, quantized by the gguf package."""
    import gguf
    import numpy as np

    reader, writer = gguf.GGUFReader(src), gguf.GGUFWriter(dst, "gpt-oss")
    for name, field in reader.fields.items():
        array = field.types[0] == gguf.GGUFValueType.ARRAY
        if name.startswith("GGUF.") or name == "general.architecture" or (array and not field.data):
            continue  # the header's own, and an empty array (no merges), which the gguf writer refuses
        writer.add_key_value(name, field.contents(), field.types[0], field.types[-1] if array else None)
    for t in reader.tensors:
        values = np.array(t.data).reshape([int(n) for n in reversed(t.shape.tolist())])
        if t.name.endswith("_exps.weight"):
            mxfp4 = gguf.GGMLQuantizationType.MXFP4
            writer.add_tensor(t.name, gguf.quants.quantize(values.astype(np.float32), mxfp4), raw_dtype=mxfp4)
        else:
            writer.add_tensor(t.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@torch.no_grad()
def test_a_file_with_mxfp4_experts_imports_as_gguf_decodes_them(exported, tmp_path):
    """The export with its experts quantized to MXFP4 by the gguf package (as converted gpt-oss files
    hold them): imported, each expert is gguf's decoding of its blocks, and the model computes as
    the run with those experts."""
    import gguf
    import numpy as np

    from handformer.cli import main
    from handformer.tasks.lm.run import load_lm

    _with_mxfp4_experts(exported[2], tmp_path / "mx.gguf")
    assert main(["import-gguf", str(tmp_path / "mx.gguf"), str(tmp_path / "back")]) == 0
    back, run = load_lm(tmp_path / "back"), load_lm(exported[1])
    tensors = {t.name: t for t in gguf.GGUFReader(tmp_path / "mx.gguf").tensors}
    for i in range(3):
        for part, proj in (("gate", "gate_proj"), ("down", "down_proj")):
            t = tensors[f"blk.{i}.ffn_{part}_exps.weight"]
            assert t.tensor_type == gguf.GGMLQuantizationType.MXFP4
            decoded = torch.from_numpy(gguf.quants.dequantize(np.array(t.data), t.tensor_type).copy())
            for e in range(3):
                ours = getattr(back.model.layers[i].ffn.experts[e], proj).weight
                assert torch.equal(ours, decoded[e]), (i, part, e)
                getattr(run.model.layers[i].ffn.experts[e], proj).weight.copy_(ours)
            up = back.model.layers[i].ffn.experts
            for e in range(3):
                run.model.layers[i].ffn.experts[e].up_proj.weight.copy_(up[e].up_proj.weight)
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(7))
    assert torch.equal(back.model(ids).logits, run.model(ids).logits)


def test_what_llama_cpps_gpt_oss_fixes_is_refused_by_name():
    """llama.cpp fixes the clamp (7), which layers are global (the odd ones) and YaRN's attention
    factor: a run with others is refused by export-gguf naming each; a file with another layer
    pattern, rope scaling or YaRN factor by import-gguf."""
    import dataclasses

    from handformer.convert.gguf_arch import family_for, mismatches
    from handformer.families.gpt_oss import read_gguf_keys

    cfg = config_from_hf(_tiny().config.to_dict())  # clamped at 1.5
    cfg = dataclasses.replace(cfg, global_layers=[0], rope_scaling=dataclasses.replace(
        cfg.rope_scaling, attention_factor=2.0))
    problems = " ".join(mismatches(cfg, family_for(cfg, "gpt_oss")))
    for named in ("swiglu_limit=1.5 (gpt-oss clamps its experts' SwiGLU at 7", "global_layers=[0] (llama.cpp's "
                  "gpt-oss makes layer i global when i % 2 = 1: [1]", "attention_factor=2.0"):
        assert named in problems
    settings = {"n_layers": 2, "max_positions": 64, "d_ff": 32, "moe": cfg.moe}
    for extra, message in (({"gpt-oss.attention.sliding_window_pattern": 3}, "every second layer global"),
                           ({"gpt-oss.rope.scaling.type": "linear"}, "YaRN or none"),
                           ({"gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.attn_factor": 2.0},
                            "attn_factor=2.0"), ({"gpt-oss.attention.sliding_window": 0}, "positive window")):
        with pytest.raises(ValueError, match=message):
            read_gguf_keys({"gpt-oss.attention.sliding_window": 4, **extra}, settings, "f.gguf")
