"""Int8Linear's "c-fp32" kernel (handformer/inference/int8_c.py): built with gcc at first use, it gives
F.linear's result on the dequantized weight (fp32 sums), and where it cannot run the layer falls back to
the default kernel."""

import pytest
import torch
import torch.nn.functional as F

from handformer.inference import int8_c
from handformer.inference.quant import DEFAULT_KERNEL, Int8Linear, dequantize_int8


def _layer(k, n, kernel):
    torch.manual_seed(0)
    return Int8Linear.from_linear(torch.nn.Linear(k, n), kernel=kernel)


@pytest.mark.parametrize("k", [48, 64])  # one full 32-wide step and a 16-wide tail; two steps
def test_the_c_kernel_is_f_linear_on_the_dequantized_weight(k):
    if int8_c.kernel() is None:
        pytest.skip(f"the C kernel cannot be built here: {int8_c.why_not()}")
    layer = _layer(k, 40, "c-fp32")
    x = torch.randn(2, 3, k)  # (B, T, K): three rows a batch
    expected = F.linear(x, dequantize_int8(layer.weight, layer.scales), layer.bias)
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


def test_without_the_c_kernel_the_layer_runs_the_default_one(monkeypatch):
    layer, default = _layer(64, 40, "c-fp32"), _layer(64, 40, DEFAULT_KERNEL)
    x = torch.randn(3, 64)
    monkeypatch.setattr(int8_c, "kernel", lambda: None)
    assert torch.equal(layer(x), default(x))
    monkeypatch.undo()
    odd, odd_default = _layer(24, 8, "c-fp32"), _layer(24, 8, DEFAULT_KERNEL)  # K not a multiple of 16
    x = torch.randn(2, 24)
    assert torch.equal(odd(x), odd_default(x))
