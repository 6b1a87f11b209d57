"""The VNNI kernels (handformer/inference/vnni_matvec.c, built by c_kernels.py at first use): int8 and
int4 weights dotted with the activation row rounded to int8 in blocks of 32. Each gives a torch
reference's result (the same rounding of the activations, then F.linear on the dequantized weight);
"auto" runs them for one or two rows; where they cannot run (no VNNI on the CPU, no C kernels at all,
HANDFORMER_NO_C_KERNELS=1, an int4 layer with zeros) the layers run the kernels they ran without
them; a tiny model's greedy tokens through them are the dequantized model's."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from handformer.config import CausalLMConfig
from handformer.generation.generate import generate
from handformer.inference import c_kernels
from handformer.inference.quant import TORCH_KERNEL, Int8Linear, dequantize_int8, quantize_linears
from handformer.inference.quant_int4 import Int4Linear, dequantize_int4, unpack_nibbles
from handformer.models.causal_lm import CausalLM

INT8, INT4 = c_kernels.VNNI


def _skip_without(name):
    if c_kernels.kernel(name) is None:
        pytest.skip(f"the VNNI kernel cannot run here: {c_kernels.why_not(name)}")


def _rounded(x):
    """x (M, K) with each block of 32 rounded as the kernels round it: int8 values, scale max|x| / 127."""
    M, K = x.shape
    blocks = x.view(M, K // 32, 32)  # (M, K/32, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, 127 / amax, 0)).clamp(-127, 127)
    return (q * (amax / 127)).view(M, K)  # (M, K)


def _int8(k, n, kernel="vnni"):
    torch.manual_seed(0)
    return Int8Linear.from_linear(torch.nn.Linear(k, n), kernel=kernel)


def _int4(k, n, kernel="vnni", zeros=False):
    """An Int4Linear holding a Q4_0-style weight: zeros 0, float16 scales (or random zeros)."""
    torch.manual_seed(0)
    layer = Int4Linear.from_linear(torch.nn.Linear(k, n), 32, kernel)
    layer.scales.copy_(layer.scales.half().float())
    if not zeros:
        layer.zeros.zero_()
    return layer


# K: one 64-wide chunk; a chunk and a 32-wide tail; 128 (one full int4 chunk); 160 (an int4 chunk and
# one group); 224 (three int8 chunks and a tail, an int4 chunk and three groups). 13 outputs; 1 row,
# and 2, 3 or 5 rows (the kernels take the rows four at a time: a short group, a full one and one more).
@torch.inference_mode()
@pytest.mark.parametrize("k,rows", [(64, 1), (96, 2), (128, 3), (160, 1), (224, 5)])
def test_each_vnni_kernel_is_f_linear_on_the_rounded_activations(k, rows):
    _skip_without(INT8)
    _skip_without(INT4)
    x = torch.randn(rows, k) * 3
    x[0, :32] = 0  # a block of zeros: scale 0
    int8, int4 = _int8(k, 13), _int4(k, 13)
    expected8 = F.linear(_rounded(x), dequantize_int8(int8.weight, int8.scales), int8.bias)
    torch.testing.assert_close(int8(x), expected8, atol=1e-5, rtol=1e-5)
    weight4 = dequantize_int4(unpack_nibbles(int4.weight), int4.scales, int4.zeros)
    torch.testing.assert_close(int4(x), F.linear(_rounded(x), weight4, int4.bias), atol=1e-5, rtol=1e-5)
    assert int4.vnni_scales() is not None


@torch.inference_mode()
def test_auto_runs_the_vnni_kernels_int8_for_any_rows_int4_for_two():
    _skip_without(INT8)
    _skip_without(INT4)
    two, three = torch.randn(1, 2, 64), torch.randn(1, 3, 64)
    for build, torch_kernel in ((_int8, TORCH_KERNEL), (_int4, "int4pack-bf16")):
        auto, vnni, plain = build(64, 40, "auto"), build(64, 40, "vnni"), build(64, 40, torch_kernel)
        assert torch.equal(auto(two), vnni(two)) and not torch.equal(auto(two), plain(two))
        assert torch.equal(auto(three), (vnni if build is _int8 else plain)(three))


@torch.no_grad()  # not inference_mode: an inference tensor keeps no count of its in-place writes
def test_an_int8_row_gives_the_same_numbers_alone_in_a_batch_or_a_prompt():
    """The int8 kernel sums each output the same way whatever the rows around it (tiles of four rows
    and four outputs): a prompt's last row is that row decoded alone; a weight written in place is
    read again."""
    _skip_without(INT8)
    layer, x = _int8(96, 13), torch.randn(7, 96)
    batch = layer(x)
    assert all(torch.equal(batch[i], layer(x[i:i + 1])[0]) for i in range(7))
    layer.weight.neg_()
    torch.testing.assert_close(layer(x), -batch + 2 * layer.bias, atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_without_vnni_the_layers_run_what_they_ran_before(monkeypatch):
    """No VNNI on the CPU: int8 runs the fp32-widening C kernel; no C kernel at all: torch's kernels;
    int4 with zeros (handformer's own asymmetric quantization): torch's kernel."""
    x = torch.randn(2, 64)
    int8, int4 = _int8(64, 40, "auto"), _int4(64, 40, "auto")
    c_fp32, torch8, torch4 = _int8(64, 40, "c-fp32"), _int8(64, 40, TORCH_KERNEL), _int4(64, 40, "int4pack-bf16")
    kernel = c_kernels.kernel
    monkeypatch.setattr(c_kernels, "kernel", lambda name="int8_linear": None if name in c_kernels.VNNI
                        else kernel(name))
    assert torch.equal(int8(x), c_fp32(x)) and torch.equal(int4(x), torch4(x))
    monkeypatch.setattr(c_kernels, "kernel", lambda name="int8_linear": None)
    assert torch.equal(int8(x), torch8(x))
    monkeypatch.undo()
    asymmetric = _int4(64, 40, "auto", zeros=True)
    assert asymmetric.vnni_scales() is None
    assert torch.equal(asymmetric(x), _int4(64, 40, "int4pack-bf16", zeros=True)(x))


def test_the_switch_turns_the_vnni_kernels_off(monkeypatch):
    monkeypatch.setenv(c_kernels.OFF_ENV, "1")
    c_kernels.kernel.cache_clear()
    try:
        assert c_kernels.kernel(INT8) is None and c_kernels.OFF_ENV in c_kernels.why_not(INT8)
    finally:
        monkeypatch.undo()
        c_kernels.kernel.cache_clear()


def test_the_kernel_asks_the_cpu_for_vnni():
    """The library's own check (gcc's __builtin_cpu_supports) agrees with the kernel's flags in
    /proc/cpuinfo: the kernels load only on a CPU that has every instruction set they use."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo here")
    flags = next(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")).split()
    has = all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c"))
    if has and c_kernels.kernel("int8_linear") is None:  # the CPU has them, but no gcc (or no build)
        pytest.skip(f"the C kernel cannot be built here: {c_kernels.why_not('int8_linear')}")
    assert (c_kernels.kernel(INT8) is not None) == has == (c_kernels.kernel(INT4) is not None)


@torch.inference_mode()
@pytest.mark.parametrize("bits", [8, 4])
def test_greedy_tokens_through_the_vnni_kernels_are_the_dequantized_models(bits):
    _skip_without(INT8 if bits == 8 else INT4)
    # A random model's logits are nearly flat: at seed 0 the int4 model's first choice is a near tie
    # (3.9632 against 3.9628), which the activations' rounding flips; seed 1 has no such tie.
    torch.manual_seed(1)
    cfg = CausalLMConfig.llama_style(vocab_size=64, d_model=64, n_heads=4, d_ff=128, n_layers=2,
                                     max_positions=64)
    model = CausalLM(cfg).eval()
    quantize_linears(model, bits=bits, group_size=32)
    layers = [m for m in model.modules() if isinstance(m, (Int8Linear, Int4Linear))]
    for m in layers:
        if bits == 4:
            m.scales.copy_(m.scales.half().float())
            m.zeros.zero_()
        m.kernel = "dequant"
    prompts = [[1, 5, 9, 2, 7]]
    expected = generate(model, prompts, 24, temperature=0)
    for m in layers:
        m.kernel = "vnni"  # the prompt's five rows too ("auto" gives them to torch's kernels)
    assert generate(model, prompts, 24, temperature=0) == expected
