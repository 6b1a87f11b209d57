"""A decoding loop, a model's returned cache and a block's own cache that compute lossily (an int8 or
float16 KV cache) are judged within the rounding such a cache makes (generate_lossy.py), and a cache
that does more than round (a wrong scale, the wrong slot) still FAILs. Two forms
(tests/fixtures/learners_lossy_cache/): an int8 cache handed back as past_key_values, its scales in
float32, run in float64; a float16 cache kept in the attention module and read back with
`.type(torch.float32)`, which raises a dtype mismatch in check's float64: its loop is driven through
its model in float32, its block NOT CHECKED with that reason (never FAIL)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from check_results import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.runners import generate_lossy

FIXTURES = Path(__file__).parent / "fixtures" / "learners_lossy_cache"
INT8, HALF = FIXTURES / "int8_past.py", FIXTURES / "half_start_pos.py"
SLOT = [("self.cache_k[:, start_pos:start_pos + T] = xk.half()", "self.cache_k[:, :T] = xk.half()"),
        ("self.cache_v[:, start_pos:start_pos + T] = xv.half()", "self.cache_v[:, :T] = xv.half()")]
READ_AS_INPUT = [(".type(torch.float32)  # (B, S, H, Dh)", ".to(x.dtype)  # (B, S, H, Dh)"),
                 ("values = self.cache_v[:, :start_pos + T].type(torch.float32)",
                  "values = self.cache_v[:, :start_pos + T].to(x.dtype)")]


def _by_name(result):
    return {c.name: c for c in result.components}


@pytest.fixture(scope="module")
def int8():
    return check_file(str(INT8))


@pytest.fixture(scope="module")
def half():
    return check_file(str(HALF))


def test_an_int8_cache_passes_within_its_rounding(int8):
    found = _by_name(int8)
    assert {c.status for c in found.values()} == {"pass"}, format_report(int8)
    assert any("computes lossily" in n["en"] for n in found["GPT"].notes), format_report(int8)
    assert any("lossy cache" in c.name["en"] for c in found["generate"].checks), format_report(int8)


def test_an_int8_cache_with_a_wrong_scale_fails(tmp_path):
    result = planted_copy(INT8, tmp_path, "scale_255", ("clamp(min=1e-6) / 127", "clamp(min=1e-6) / 255"))
    found = _by_name(result)
    assert found["GPT"].status == "fail" and found["generate"].status == "fail", format_report(result)


def test_a_float16_cache_read_in_float32_drives_its_loop_in_float32(half):
    found = _by_name(half)
    assert found["generate"].status == "pass", format_report(half)
    assert "in float32" in found["generate"].driven["en"], format_report(half)
    block = found["TransformerBlock"]
    assert block.status == "not_checked" and "float64" in block.error.message, format_report(half)


def test_a_float16_cache_written_at_the_wrong_slot_fails(tmp_path):
    result = planted_copy(HALF, tmp_path, "slot", *SLOT)
    assert _by_name(result)["generate"].status == "fail", format_report(result)


def test_a_float16_cache_read_in_the_input_dtype_passes_its_block(tmp_path):
    result = planted_copy(HALF, tmp_path, "read_as_input", *READ_AS_INPUT)
    block = _by_name(result)["TransformerBlock"]
    assert block.status == "pass", format_report(result)
    assert any("computes lossily" in n["en"] for n in block.notes), format_report(result)


def _run(own, full, out):
    """A run of a loop whose model handed it `own` logits (n, B, V) where the full forward gives `full`."""
    prompt = torch.zeros(1, 2, dtype=torch.long)
    model = types.SimpleNamespace(outputs=list(own), module=generate_lossy, exact=lambda ids: full[
        ids.size(1) - prompt.size(1)][:, None])  # (B, 1, V): the last position's
    return types.SimpleNamespace(model=model, prompt=prompt, out=torch.tensor([out]))


def test_a_token_apart_is_excused_only_at_a_near_tie_within_the_measured_error(monkeypatch):
    monkeypatch.setattr(generate_lossy, "tolerance", lambda _: generate_lossy.LOSSY)
    full = torch.tensor([[[3.0, 2.995, 0.0]], [[0.0, 1.0, 3.0]]])  # (n, B, V): a near tie at step 0
    own = full + torch.tensor([[[0.0, 0.01, 0.0]], [[0.0, 0.0, 0.0]]])
    assert generate_lossy.excused(_run(own, full, [1, 2]))  # token 1: 0.005 below, within 2 * 0.01
    assert not generate_lossy.excused(_run(own, full, [2, 2]))  # token 2: 3.0 below
    far = full + torch.tensor([[[0.0, 0.4, 0.0]], [[0.0, 0.0, 0.0]]])  # 13 % of the range: not rounding
    assert not generate_lossy.excused(_run(far, full, [1, 2]))
