"""int8 weight-only quantization (handformer/inference/quant.py) and `handformer quantize` runs.

The arithmetic is pinned against its definition (scale = max|row| / 127, round, clamp), the two
kernels against each other and against F.linear on the dequantized weight, and a quantized run
against the in-memory quantized model it was written from (bit for bit after save + load).
"""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from handformer.cli import main
from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.generation.generate import generate
from handformer.inference.quant import (
    DEFAULT_KERNEL,
    KERNELS,
    Int8Linear,
    dequantize_int8,
    int8pack_available,
    quantize_int8,
    quantize_linears,
)
from handformer.inference.quant_int4 import (
    Int4Linear,
    dequantize_int4,
    pack_nibbles,
    quantize_int4,
    unpack_nibbles,
)
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.quantize import native_bf16
from handformer.tasks.lm.run import load_lm, save_lm_run

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = "the quick brown fox jumps over the lazy dog. " * 20


def test_quantize_int8_follows_its_definition():
    w = torch.randn(6, 40, generator=torch.Generator().manual_seed(0)) * torch.arange(1, 7)[:, None]
    w[3] = 0.0  # an all-zero row must not divide by zero
    q, scales = quantize_int8(w)
    assert q.dtype == torch.int8 and scales.dtype == torch.float32 and scales.shape == (6,)
    rows = [r for r in range(6) if r != 3]
    torch.testing.assert_close(scales[rows], w[rows].abs().amax(1) / 127)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    assert torch.equal(q[3], torch.zeros(40, dtype=torch.int8))
    assert torch.equal(q[rows], torch.round(w[rows] / scales[rows, None]).to(torch.int8))
    # Rounding error at most half a step per element.
    err = (dequantize_int8(q, scales) - w).abs()
    assert bool((err <= scales[:, None] / 2 + 1e-6).all())


@pytest.mark.parametrize("bias,k", [(True, 48), (False, 48), (True, 40), (False, 172)])
@torch.no_grad()
def test_every_kernel_equals_linear_on_the_dequantized_weight(bias, k):
    """K = 40 and 172 are not multiples of 16, where torch's bf16 int8 kernel goes wrong (or
    crashes): those layers must fall back to an exact kernel."""
    assert int8pack_available("cpu")  # this torch has the CPU kernel
    linear = torch.nn.Linear(k, 20, bias=bias)
    x = torch.randn(2, 5, k)
    layers = {k: Int8Linear.from_linear(linear, k) for k in KERNELS}
    expected = F.linear(x, dequantize_int8(layers["dequant"].weight, layers["dequant"].scales), linear.bias)
    torch.testing.assert_close(layers["dequant"](x), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layers["int8pack-fp32"](x), expected, atol=1e-5, rtol=1e-5)
    # bf16 activations, scales and outputs: each rounded to 8 significant bits.
    torch.testing.assert_close(layers["int8pack-bf16"](x), expected, atol=2e-2, rtol=2e-2)
    assert layers["int8pack-bf16"](x).dtype == torch.float32
    fast = layers[DEFAULT_KERNEL]
    assert fast(x).shape == (2, 5, 20)
    # And it stays close to the float layer it came from.
    assert (fast(x) - linear(x)).abs().max() < 0.02 * linear(x).abs().max()


def test_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel is 'fast'"):
        Int8Linear(4, 4, kernel="fast")


def _model(preset: str, tied: bool) -> CausalLM:
    torch.manual_seed(0)
    style = CausalLMConfig.gpt2_style if preset == "gpt2" else CausalLMConfig.llama_style
    extra = {} if preset == "gpt2" else {"n_kv_heads": 2}
    cfg = style(vocab_size=30, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_positions=64,
                tie_embeddings=tied, **extra)
    return CausalLM(cfg).eval()


@pytest.mark.parametrize("preset,tied", [("gpt2", True), ("llama", False)])
@pytest.mark.parametrize("head", [True, False])
@torch.no_grad()
def test_quantize_linears_replaces_every_linear_layer(preset, tied, head):
    model = _model(preset, tied)
    ids = torch.randint(0, 30, (2, 12), generator=torch.Generator().manual_seed(1))
    expected = model(ids).logits
    names = quantize_linears(model, skip=() if head else ("lm_head",))
    per_layer = 6 if preset == "gpt2" else 7  # q k v o + up down (+ gate)
    assert len(names) == 2 * per_layer + head
    assert any(type(m) is torch.nn.Linear for m in model.modules()) == (not head)
    assert isinstance(model.lm_head, Int8Linear) == head
    assert model.embed.weight.dtype == torch.float32  # the lookup table stays float
    logits = model(ids).logits
    assert (logits - expected).abs().max() < 0.05 * expected.abs().max()
    # Cached decoding through the int8 layers equals decoding without the cache.
    prompt = ids[0, :4].tolist()
    cached = generate(model, [prompt], 6, temperature=0)[0]
    full = list(prompt)
    for _ in range(6):
        full.append(int(model(torch.tensor([full])).logits[0, -1].argmax()))
    assert cached == full[4:]


def _run(tmp_path, preset="gpt2", tied=True):
    model = _model(preset, tied)
    tok = Tokenizer.train_char([TEXT])
    cfg = model.cfg
    model = CausalLM(CausalLMConfig.from_dict({**cfg.to_dict(), "vocab_size": tok.vocab_size}, "model"))
    save_lm_run(tmp_path / "run", model.eval(), tok, SpecialTokens(),
                data={"path": str(tmp_path / "text.txt"), "val_fraction": 0.5})
    (tmp_path / "text.txt").write_text(TEXT)
    return tmp_path / "run"


@pytest.mark.parametrize("preset,tied", [("gpt2", True), ("llama", False)])
@torch.no_grad()
def test_quantize_command_writes_a_run_that_generate_and_eval_load(preset, tied, tmp_path, capsys):
    run_dir = _run(tmp_path, preset, tied)
    out = tmp_path / "int8"
    assert main(["quantize", str(run_dir), str(out), "--int8"]) == 0
    assert "linear layers quantized (output head included)" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["weights"] == "int8" and config["quantization"]["head"] is True
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes["layers.0.self_attn.q_proj.weight"] == "I8"
    assert dtypes["layers.0.self_attn.q_proj.scales"] == "F32"
    assert dtypes["lm_head.weight"] == "I8" and dtypes["embed.weight"] == "F32"

    # The loaded run is exactly the model quantized in memory.
    float_run = load_lm(run_dir)
    quantize_linears(float_run.model)
    run = load_lm(out)
    assert isinstance(run.model.lm_head, Int8Linear)
    ids = torch.tensor([run.tokenizer.encode("the lazy fox")])
    assert torch.equal(run.model(ids).logits, float_run.model(ids).logits)

    assert main(["generate", str(out), "--prompt", "the ", "--temperature", "0",
                 "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("the ")
    assert main(["eval", str(out), "--data", "val"]) == 0
    assert capsys.readouterr().out.startswith("loss ")


@torch.no_grad()
def test_head_kept_in_fp32_and_bf16(tmp_path, capsys):
    run_dir = _run(tmp_path)
    assert main(["quantize", str(run_dir), str(tmp_path / "nohead"), "--int8", "--keep-head-fp32"]) == 0
    assert "output head kept in fp32" in capsys.readouterr().out
    run = load_lm(tmp_path / "nohead")
    assert type(run.model.lm_head) is torch.nn.Linear
    assert run.model.lm_head.weight is run.model.embed.weight  # still tied

    assert main(["quantize", str(run_dir), str(tmp_path / "bf16"), "--bf16"]) == 0
    out = capsys.readouterr().out
    assert native_bf16()[1] in out
    run = load_lm(tmp_path / "bf16")
    assert run.model.embed.weight.dtype == torch.bfloat16
    assert main(["generate", str(tmp_path / "bf16"), "--prompt", "the ", "--temperature", "0",
                 "--max-new-tokens", "3"]) == 0


def test_native_bf16_is_read_from_the_cpu_flags():
    assert native_bf16("flags\t\t: fpu avx512f avx512_bf16 amx_tile\n") == (
        True, "this CPU has native bf16 (avx512_bf16)")
    native, sentence = native_bf16("flags\t\t: fpu sse2 avx2\n")
    assert not native and "no native bf16" in sentence and "prefer --int8" in sentence
    assert not native_bf16("")[0]


def test_quantize_errors_are_one_line(tmp_path, capsys):
    run_dir = _run(tmp_path)
    out = str(tmp_path / "q")

    def fails(args, message):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1

    fails(["quantize", str(run_dir), out], "choose one format")
    fails(["quantize", str(run_dir), out, "--int8", "--bf16"], "choose one format")
    fails(["quantize", str(tmp_path / "nope"), out, "--int8"], "not a run directory")
    fails(["quantize", str(run_dir), str(run_dir), "--int8"], "must differ")
    assert main(["quantize", str(run_dir), out, "--int8"]) == 0
    fails(["quantize", str(run_dir), out, "--int8"], "already holds a run")
    fails(["quantize", out, str(tmp_path / "q2"), "--int8"], "already quantized")
    config = json.loads((tmp_path / "q" / "config.json").read_text())
    config["quantization"]["weights"] = "int3"
    (tmp_path / "q" / "config.json").write_text(json.dumps(config))
    fails(["generate", out, "--prompt", "a"], "'quantization' must be a table with weights")


def test_quantize_refuses_lora_and_quantized_runs_before_loading_them(tmp_path, monkeypatch):
    from handformer.tasks.lm.quantize import quantize_run

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before a refusal that config.json alone decides")

    monkeypatch.setattr("handformer.tasks.lm.run.load_lm", no_load)
    run_dir = _run(tmp_path)
    config = json.loads((run_dir / "config.json").read_text())
    for section, message in (("lora", "holds LoRA adapters"), ("quantization", "already quantized")):
        (run_dir / "config.json").write_text(json.dumps({**config, section: {"r": 4}}))
        with pytest.raises(ValueError, match=message):
            quantize_run(run_dir, tmp_path / "out", "int8")
    with pytest.raises(ValueError, match="--int8, --int4 or --bf16"):
        quantize_run(run_dir, tmp_path / "out", "int2")


def _decode_limit():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "decode_limit.py"
    spec = importlib.util.spec_from_file_location("decode_limit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decode_limit_counts_the_bytes_a_step_reads(capsys):
    """The bound's denominator: weights as stored (int8 + fp32 scales), one embedding row, and the
    KV cache; then a seconds-long smoke run of the benchmark on the tiny model."""
    bench = _decode_limit()
    model = _model("llama", tied=False)  # V 30, D 32, 2 layers, F 64, Hkv 2 of 4 heads
    linears = 2 * (32 * 32 * 2 + 2 * 16 * 32 + 3 * 64 * 32) + 30 * 32  # q, o; k, v (Hkv); FFN; head
    norms = 2 * 2 * 32 + 32
    kv = 2 * 2 * 2 * 8 * 4 * 10  # K and V, 2 layers, Hkv 2, Dh 8, fp32, 10 positions
    assert bench.bytes_per_token(model, 10) == 4 * (linears + norms + 32) + kv
    quantize_linears(model)
    scales = 2 * (32 + 16 + 16 + 32 + 64 + 64 + 32) + 30
    assert bench.bytes_per_token(model, 10) == linears + 4 * (scales + norms + 32) + kv

    import argparse

    args = argparse.Namespace(prompt=4, new_tokens=2, rounds=1, run_c=None, ttft_prompt=8, batches=[],
                              batch_new_tokens=2)
    assert bench.batch1("tiny", args, torch.ones(1000)) == []  # no fp32 case differs from HF
    out = capsys.readouterr().out
    assert "same tokens as HF: True" in out and "handformer int8, head fp32" in out
    assert "threads: handformer fp32 and HF 1" in out  # the tiny model decodes on one thread: HF too
    for case in ("handformer fp32", "handformer int8", "handformer int4 (groups of 32)",
                 "handformer bf16 weights"):
        assert f"tokens against HF fp32, batch 1, {case}: " in out


def test_decode_limit_reports_token_agreement_and_exits_1_where_fp32_differs(monkeypatch, capsys):
    bench = _decode_limit()
    assert bench.agreement([[1, 2, 3]], [[1, 2, 3]]) == (True, "same")
    assert bench.agreement([[1, 2, 9], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) == (
        False, "differs in 1 of 2 row(s); 5 of 6 tokens agree before each row's first difference")
    real = bench.hf_generate
    monkeypatch.setattr(bench, "hf_generate", lambda hf, p, n: [[(t + 1) % 512 for t in row]
                                                                for row in real(hf, p, n)])
    monkeypatch.setattr("sys.argv", ["decode_limit.py", "--models", "tiny", "--rounds", "1",
                                     "--new-tokens", "2", "--prompt", "4", "--bandwidth-mib", "1"])
    with pytest.raises(SystemExit) as stop:
        bench.main()
    assert stop.value.code == 1
    out = capsys.readouterr().out
    assert "fp32 tokens differ from Hugging Face's:" in out
    assert "tiny: batch 1, handformer fp32: differs in 1 of 1 row(s); 0 of 2 tokens agree" in out


# --- int4 -----------------------------------------------------------------------------------------

def test_quantize_int4_follows_its_definition():
    w = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))
    q, scales, zeros = quantize_int4(w, 32)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15 and scales.shape == zeros.shape == (5, 2)
    groups = w.view(5, 2, 32)
    torch.testing.assert_close(scales, (groups.amax(-1) - groups.amin(-1)) / 15)
    torch.testing.assert_close(zeros, groups.amin(-1) + 8 * scales)
    err = (dequantize_int4(q, scales, zeros) - w).view(5, 2, 32).abs()
    assert bool((err <= scales[..., None] / 2 + 1e-6).all())
    assert torch.equal(unpack_nibbles(pack_nibbles(q)), q)
    with pytest.raises(ValueError, match="group size is 48"):
        quantize_int4(w, 48)


@pytest.mark.parametrize("n,group,bias", [(30, 32, True), (64, 64, False), (7, 32, True)])
@torch.no_grad()
def test_int4_kernel_equals_the_dequantized_weight_and_survives_loading(n, group, bias):
    """N = 30 and 7 are not multiples of 16, which torch's int4 CPU kernel needs: padded rows."""
    linear = torch.nn.Linear(128, n, bias=bias)
    x = torch.randn(3, 4, 128)
    fast = Int4Linear.from_linear(linear, group)
    slow = Int4Linear.from_linear(linear, group, kernel="dequant")
    q = unpack_nibbles(fast.weight)
    expected = F.linear(x, dequantize_int4(q, fast.scales, fast.zeros), linear.bias)
    torch.testing.assert_close(slow(x), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast(x), expected, atol=3e-2, rtol=3e-2)  # bf16 activations
    assert fast(x).shape == (3, 4, n)
    loaded = Int4Linear(128, n, bias, group)
    loaded(x)  # packs its initial (zero) weights ...
    loaded.load_state_dict(fast.state_dict())  # ... which loading must replace
    assert torch.equal(loaded(x), fast(x))


@torch.no_grad()
def test_int4_run_with_int8_for_layers_the_group_does_not_divide(tmp_path, capsys):
    run_dir = _run(tmp_path, "llama", tied=False)  # d_ff 64, d_model 32
    assert main(["quantize", str(run_dir), str(tmp_path / "q4"), "--int4", "--group-size", "64"]) == 0
    assert "groups of 64" in capsys.readouterr().out
    run = load_lm(tmp_path / "q4")
    assert isinstance(run.model.layers[0].ffn.down_proj, Int4Linear)  # input width 64
    assert isinstance(run.model.layers[0].self_attn.q_proj, Int8Linear)  # input width 32
    float_run = load_lm(run_dir)
    quantize_linears(float_run.model, bits=4, group_size=64)
    ids = torch.tensor([run.tokenizer.encode("the lazy fox")])
    assert torch.equal(run.model(ids).logits, float_run.model(ids).logits)
    assert main(["eval", str(tmp_path / "q4"), "--data", "val"]) == 0
    assert main(["quantize", str(run_dir), str(tmp_path / "x"), "--int8", "--group-size", "32"]) == 2
    assert main(["quantize", str(run_dir), str(tmp_path / "x"), "--int4", "--group-size", "48"]) == 2
    assert "int4 group size is 48" in capsys.readouterr().err
