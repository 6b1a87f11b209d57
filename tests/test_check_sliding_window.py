"""Mistral's style (fixtures/learners_sliding_window/correct.py): a ModelArgs whose window_size has no
default (filled with a window as long as check's longest input: full causal attention), an attention
that takes its positions as one row (T,) and one (T, T) additive mask for the whole batch
(`mask[None, None, :, :]`); a block handed that mask on, and a model whose forward requires the
positions (`forward(input_ids, positions)`, handed one row). All pass; a planted scale fails at its
line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_sliding_window"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


def test_window_positions_and_shared_mask_are_driven(correct):
    report = format_report(correct)
    assert {c.name: c.status for c in correct.components} == {
        "Attention": "pass", "FeedForward": "pass", "RMSNorm": "pass", "TransformerBlock": "pass",
        "Transformer": "pass"}, report
    assert "rank 2: (T, S), one mask for the whole batch" in report, report


def test_a_planted_scale_fails_at_its_line(tmp_path):
    edit = ("scores = q @ k.transpose(-2, -1) * a.head_dim ** -0.5", "scores = q @ k.transpose(-2, -1) / a.head_dim")
    result = check_file(edited_copy(tmp_path, HERE / "correct.py", [edit]), only=["gqa"])
    report = format_report(result)
    failed = [c for c in result.components if c.status == "fail"]
    assert failed and "scale_by_dk" in [f.name for c in failed for f in c.findings], report
    assert "line 56: scores = q @ k.transpose(-2, -1) / a.head_dim" in report, report
