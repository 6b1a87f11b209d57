"""Filters that take one row of logits (V,) at a time (fixtures/learners_row_filters/): a wrong one is
localized on one row alone, its steps (V,) read against that row's sub-steps, so the FAIL quotes the
line that departs, not the function's `def` line. Two forms: a nucleus filter that writes into its
row in place (it may while the localizer's rows carry a gradient), and a min-p filter that builds a
new row."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_row_filters"
ONLY = ["top_p", "min_p"]


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"), only=ONLY)


@pytest.fixture(scope="module")
def nucleus_scaled():
    return check_file(str(HERE / "nucleus_scaled.py"), only=["top_p"])


@pytest.fixture(scope="module")
def min_p_sharpened():
    return check_file(str(HERE / "min_p_sharpened.py"), only=["min_p"])


def _line(text: str, result) -> int:
    return next(n for n, line in enumerate(Path(result.path).read_text().splitlines(), 1) if text in line)


def test_both_row_filters_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"nucleus_filter": "pass", "min_p_filter": "pass"}, format_report(correct)


@pytest.mark.parametrize("planted, text", [("nucleus_scaled", "dim=-1) * 0.9"),
                                           ("min_p_sharpened", "softmax(logits * 2")])
def test_a_row_filter_fails_at_the_line_that_departs(planted, text, request):
    result = request.getfixturevalue(planted)
    (filt,) = result.components
    found = [(f.name, f.line) for f in filt.findings]
    assert filt.status == "fail" and found == [("departs", _line(text, result))], format_report(result)
