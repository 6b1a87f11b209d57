"""The bandwidth bound every decode benchmark prints (handformer/inference/roofline.py): a model's
bytes per token do not change when its layers are packed for decoding, an int4 layer counts what its
kernel reads, and the bound and MBU are the definitions' arithmetic."""

from __future__ import annotations

import pytest
import torch
from helpers import missing

from handformer.config import CausalLMConfig
from handformer.inference.packed_linear import PackedLinear, packing_available
from handformer.inference.prepare import prepare_for_decoding
from handformer.inference.quant import quantize_linears
from handformer.inference.quant_int4 import Int4Linear
from handformer.inference.roofline import bound, bytes_per_token, int4_bytes, read_bandwidth, roofline_line
from handformer.models.causal_lm import CausalLM

pytestmark = pytest.mark.usefixtures("one_thread")


def test_packing_for_decoding_leaves_the_bytes_a_step_reads_alone():
    if not packing_available():  # fails under HANDFORMER_REQUIRE_REFERENCES=1, as the other references do
        missing("this torch has no oneDNN linear packing (torch.ops.mkldnn; an x86 build of torch has it)")
    torch.manual_seed(0)
    cfg = CausalLMConfig.gpt2_style(vocab_size=64, d_model=512, n_heads=8, d_ff=1024, n_layers=1,
                                    max_positions=32, dropout=0.0)  # 1 MiB matrices: packed
    model = CausalLM(cfg).eval()
    plain = bytes_per_token(model, 10)
    prepare_for_decoding(model)
    assert any(isinstance(m, PackedLinear) for m in model.modules())
    assert bytes_per_token(model, 10) == pytest.approx(plain, rel=1e-6)
    kv = 2 * cfg.n_layers * cfg.kv_heads * cfg.head_dim * 4  # K and V of one position, fp32
    assert bytes_per_token(model, 20) - bytes_per_token(model, 10) == 10 * kv
    assert bound(1e9, model, 10) == 1e9 / plain


def test_bound_and_mbu_lines():
    assert roofline_line(28.0, 35.0) == "28.0 tokens/s, bound 35.0 tokens/s, MBU 0.80"
    assert read_bandwidth(1, size=2**24, repeats=2) > 1e8  # bytes/s of a 16 MiB read: any machine


def test_an_int4_layer_counts_the_nibbles_and_the_scales_its_kernel_reads():
    """Q4_0 form (zeros 0): 18 bytes a group of 32, as the file holds it; with zeros: 20 (a bf16 scale
    and zero); never the stored float32 scales and zeros (24)."""
    layer = Int4Linear(64, 8, bias=False)  # 8 rows of 2 groups
    assert int4_bytes(layer) == 16 * 18
    layer.zeros.fill_(0.5)
    assert int4_bytes(layer) == 16 * 20
    torch.manual_seed(0)
    cfg = CausalLMConfig.llama_style(vocab_size=64, d_model=64, n_heads=4, d_ff=128, n_layers=1,
                                     max_positions=32)
    model = CausalLM(cfg).eval()
    plain = bytes_per_token(model, 0)
    linears = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Linear))
    quantize_linears(model, bits=4, group_size=32)
    for m in model.modules():
        if isinstance(m, Int4Linear):
            m.zeros.zero_()
    assert bytes_per_token(model, 0) == plain - linears + linears / 4 / 32 * 18
