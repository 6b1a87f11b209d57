"""`handformer check` on decoder-only blocks whose forward takes the causal mask and the keys' padding
apart and hands them on to nn.MultiheadAttention as attn_mask and key_padding_mask: the padding
argument, found by what the forward passes it on as (whatever its name or place), is handed a key
padding mask (B, S) of its own, never the causal one; the block passes, its padding is checked, and a
planted mistake fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_torch_masks"
FILES = ("correct", "padding_first", "ffn_norm_missing", "ffn_residual_missing")


@pytest.fixture(scope="module")
def reports():
    return {name: check_file(str(HERE / f"{name}.py")) for name in FILES}


@pytest.mark.parametrize(("name", "status", "padding"), [("correct", "pass", "padding_mask"),
                                                         ("padding_first", "differs", "pad_mask")])
def test_both_masks_are_handed_in_the_form_the_call_passes_on(reports, name, status, padding):
    (block,) = reports[name].components
    assert block.status == status, format_report(reports[name])
    assert all(c.ok for c in block.checks), format_report(reports[name])
    assert any(c.name["en"].startswith(f"{padding} alone") for c in block.checks), format_report(reports[name])


@pytest.mark.parametrize(("name", "line"), [("ffn_norm_missing", 19), ("ffn_residual_missing", 21)])
def test_a_planted_mistake_fails_at_its_line(reports, name, line):
    (block,) = reports[name].components
    assert block.status == "fail", format_report(reports[name])
    assert [f.line for f in block.findings] == [line], format_report(reports[name])
