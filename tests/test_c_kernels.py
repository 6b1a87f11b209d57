"""The C kernels (handformer/inference/c_kernels.py), built with gcc at first use: Int8Linear's int8 kernel
gives F.linear's result on the dequantized weight (fp32 sums), PackedLinear's fp32 one-row kernel gives
F.linear's; by default both run for one or two rows only, a greedy decode through them gives the plain
model's tokens, and where they cannot run the layers run torch's kernels."""

import pytest
import torch
import torch.nn.functional as F

from handformer.config import CausalLMConfig
from handformer.generation.generate import generate
from handformer.inference import c_kernels
from handformer.inference.packed_linear import PackedLinear, pack_linears
from handformer.inference.quant import TORCH_KERNEL, Int8Linear, dequantize_int8
from handformer.models.causal_lm import CausalLM


def _skip_without(name):
    if c_kernels.kernel(name) is None:
        pytest.skip(f"the C kernel cannot be built here: {c_kernels.why_not(name)}")


def _layer(k, n, kernel):
    torch.manual_seed(0)
    return Int8Linear.from_linear(torch.nn.Linear(k, n), kernel=kernel)


@pytest.mark.parametrize("k", [48, 64])  # one full 32-wide step and a 16-wide tail; two steps
def test_the_int8_kernel_is_f_linear_on_the_dequantized_weight(k):
    _skip_without("int8_linear")
    layer = _layer(k, 40, "c-fp32")
    x = torch.randn(2, 3, k)  # (B, T, K): three rows a batch
    expected = F.linear(x, dequantize_int8(layer.weight, layer.scales), layer.bias)
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


def test_auto_runs_the_int8_c_kernel_for_two_rows_and_torch_for_more(monkeypatch):
    _skip_without("int8_linear")
    kernel = c_kernels.kernel  # the CPU without VNNI (tests/test_vnni_kernels.py: with it)
    monkeypatch.setattr(c_kernels, "kernel", lambda name="int8_linear": None if name in c_kernels.VNNI
                        else kernel(name))
    auto, c, torch_kernel = _layer(64, 40, "auto"), _layer(64, 40, "c-fp32"), _layer(64, 40, TORCH_KERNEL)
    two, three = torch.randn(1, 2, 64), torch.randn(1, 3, 64)
    assert torch.equal(auto(two), c(two)) and not torch.equal(auto(two), torch_kernel(two))
    assert torch.equal(auto(three), torch_kernel(three))


def test_without_the_c_kernel_the_layer_runs_torchs(monkeypatch):
    layer, default = _layer(64, 40, "c-fp32"), _layer(64, 40, TORCH_KERNEL)
    x = torch.randn(3, 64)
    monkeypatch.setattr(c_kernels, "kernel", lambda name="int8_linear": None)
    assert torch.equal(layer(x), default(x))
    monkeypatch.undo()
    odd, odd_default = _layer(24, 8, "c-fp32"), _layer(24, 8, TORCH_KERNEL)  # K not a multiple of 16
    x = torch.randn(2, 24)
    assert torch.equal(odd(x), odd_default(x))


@torch.inference_mode()
@pytest.mark.parametrize("rows", [1, 2, 3])  # the C kernel, then oneDNN's packed one
def test_the_fp32_kernel_is_f_linear(rows, monkeypatch):
    _skip_without("f32_linear")
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 42)  # 42 outputs: ten blocks of four and a tail of two
    layer = PackedLinear.from_linear(linear).eval()
    calls = []
    kernel = c_kernels.f32_linear
    monkeypatch.setattr(c_kernels, "f32_linear", lambda *a: calls.append(1) or kernel(*a))
    x = torch.randn(rows, 48)
    torch.testing.assert_close(layer(x), linear(x), atol=1e-5, rtol=1e-5)
    assert len(calls) == (rows <= c_kernels.MAX_ROWS)
    assert torch.equal(layer.weight, linear.weight)  # the state dict's weight is the one given


def test_without_the_c_kernel_packed_layers_keep_one_copy(monkeypatch):
    monkeypatch.setattr(c_kernels, "kernel", lambda name="f32_linear": None)
    assert PackedLinear.from_linear(torch.nn.Linear(48, 42)).blocked is None
    monkeypatch.undo()
    assert PackedLinear.from_linear(torch.nn.Linear(40, 42)).blocked is None  # K not a multiple of 16


@torch.inference_mode()
@pytest.mark.parametrize("style", ["gpt2_style", "llama_style"])
def test_greedy_tokens_through_the_c_kernels_are_the_plain_models(style):
    _skip_without("f32_linear")
    torch.manual_seed(0)
    cfg = getattr(CausalLMConfig, style)(vocab_size=64, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                         max_positions=64)
    model = CausalLM(cfg).eval()
    prompts = [[1, 5, 9, 2, 7]]
    expected = generate(model, prompts, 24, temperature=0)
    assert pack_linears(model, min_bytes=0)  # every layer packed: batch 1 decodes through f32_linear
    assert generate(model, prompts, 24, temperature=0) == expected


def test_loading_the_kernels_keeps_subnormal_floats():
    """A library linked with -ffast-math turns on flush-to-zero for the whole process as it loads
    (gcc adds crtfastmath.o): every float below 2^-126 would then read as 0 in torch and numpy."""
    import numpy as np

    loaded = [name for name in c_kernels.SOURCES if c_kernels.kernel(name) is not None]
    assert loaded or c_kernels.why_not("decoder_step") is not None
    tiny = torch.tensor([1e-40])  # a subnormal float32
    assert (tiny * 2).item() != 0
    assert np.float32(1e-40) * np.float32(2) != 0


def test_the_one_row_copy_of_a_large_weight_starts_on_a_huge_page():
    """block_rows asks the kernel for 2 MiB pages (Linux): the copy starts on a 2 MiB boundary and
    reads back as the weight."""
    if c_kernels._libc() is None:
        pytest.skip("huge pages are asked for on Linux only")
    weight = torch.randn(1023, 768)  # 3 MiB; the last block of four rows is short
    blocked = c_kernels.block_rows(weight)
    assert blocked.data_ptr() % c_kernels.HUGE_PAGE == 0
    assert torch.equal(c_kernels.unblock_rows(blocked, 1023), weight)


def test_every_kernel_source_ships_in_the_package():
    """A wheel carries each C source and header (built at first use): a .c or .h file missing from
    pyproject.toml's package data leaves an installed handformer on torch's kernels without a word."""
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[1]
    shipped = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["handformer"]
    sources = sorted(p.relative_to(root / "handformer").as_posix() for pattern in ("*.c", "*.h")
                     for p in (root / "handformer").rglob(pattern))
    assert sources and not [s for s in sources if s not in shipped], (
        f"add to [tool.setuptools.package-data] in pyproject.toml: {[s for s in sources if s not in shipped]}")
