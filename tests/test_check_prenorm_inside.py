"""Sublayers that normalize their own input first and add no residual, the encoder loop adding it
(vit-pytorch's Attention and FeedForward: fixtures/learners_vit_prenorm/correct.py): checked as the
norm followed by the sublayer, so they pass; a plant in the attention, the mask the file's comment
states, or the loop's residual fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_vit_prenorm"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


def test_norm_then_sublayer_passes(correct):
    report = format_report(correct)
    assert {c.name: c.status for c in correct.components} == {
        "SelfAttention": "pass", "MLP": "pass", "Transformer": "pass"}, report
    assert "it normalizes its input first (ln) and adds no residual" in report, report
    assert "the sublayer compared with block.0 taken out" in report, report


PLANTS = {  # (the edit, the finding's name, the line quoted)
    "softmax_wrong_dim": (("F.softmax(att, dim=-1)", "F.softmax(att, dim=-2)"), "softmax_wrong_dim",
                          "line 48: att = self.drop(F.softmax(att, dim=-2))"),
    "mask_inverted": (("~pad_mask[", "pad_mask["), "mask_inverted",
                      "line 47: att = att.masked_fill(pad_mask[:, None, None, :], -1e9)"),
    # the stack hands the MLP's output on alone (it adds no residual inside): named at the loop's call
    "no_residual": (("x = x + mlp(x)", "x = mlp(x)"), "no_residual", "line 65: x = mlp(x)"),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_line_fails_where_it_is(tmp_path, plant):
    edit, name, line = PLANTS[plant]
    result = check_file(edited_copy(tmp_path, HERE / "correct.py", [edit]))
    report = format_report(result)
    failed = [c for c in result.components if c.status == "fail"]
    assert failed and name in [f.name for c in failed for f in c.findings], report
    assert line in report, report
