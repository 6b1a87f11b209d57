"""A blockwise quantization is graded by its round trip through quantize and the dequantize beside it,
whatever its code: QLoRA's NF4 packed two to a byte with a state object, a symmetric int4 per group whose
dequantize takes the shape, an int8 whose block size is a constant of the file, an int8 KV cache's
scale per token whose inverse is named `dequantize` alone. Each planted mistake
FAILs; a quantize with no dequantize beside it, a dequantize that returns no tensor and a noise mask
of the wrong length are NOT CHECKED, never failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_quantize"
CORRECT = ("nf4", "int4_groups", "int8_rows", "int8_per_token")
PLANTED = ("nf4_absmax_signed", "nf4_nibbles_swapped", "int4_truncated", "int8_per_token_255")
ALONE = '''
import torch


def quantize_nf4(w, blocksize=64):
    blocks = w.reshape(-1, blocksize)
    return blocks / blocks.abs().amax(dim=1, keepdim=True)


def quantize_int8(x, block_size=64):
    b = x.reshape(-1, block_size)
    s = b.abs().amax(1, keepdim=True) / 127
    return torch.round(b / s), s


def dequantize_int8(q, s):
    return (q * s).flatten(), "a second value"


def random_spans_noise_mask(length, noise_density=0.15):
    return [False, True]
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    alone = tmp_path_factory.mktemp("quantize") / "alone.py"
    alone.write_text(ALONE, encoding="utf-8")
    files = {name: str(HERE / f"{name}.py") for name in CORRECT + PLANTED} | {"alone": str(alone)}
    return {name: check_file(path, only=["quantize", "span_noise_mask"]) for name, path in files.items()}


@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_round_trip_passes_whatever_its_code(results, name):
    (comp,) = results[name].components
    assert comp.kind == "quantize" and comp.status == "pass", format_report(results[name])


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_mistake_in_quantize_or_dequantize_fails(results, name):
    (comp,) = results[name].components
    assert comp.status == "fail", format_report(results[name])
    assert "times what is allowed" in format_report(results[name])


def test_what_cannot_be_round_tripped_or_read_as_a_mask_is_not_checked(results):
    comps = {c.name: c for c in results["alone"].components}
    assert {c.status for c in comps.values()} == {"not_checked"}, format_report(results["alone"])
    assert "dequantize_nf4" in comps["quantize_nf4"].error.message and "还原" in comps["quantize_nf4"].error.message_zh
    assert "returned a tuple, not a tensor" in comps["quantize_int8"].error.message
    assert "no mask of 20 positions" in comps["random_spans_noise_mask"].error.message
