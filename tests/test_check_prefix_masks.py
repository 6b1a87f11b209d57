"""Prefix-LM masks (fixtures/learners_prefix_lm/): a mask function with an argument that names the prefix
is the causal mask with no prefix, and, handed prefixes of 3 and 1 tokens (or 3 as one number), lets
each query see its row's whole prefix; a prefix one column too wide fails at the line that bounds it.
A mask that fills 1 where its prefix holds is read as 1 = may attend."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_prefix_lm"


@pytest.fixture(scope="module", params=["rows_filled.py", "one_number.py"])
def right(request):
    return check_file(str(HERE / request.param), only=["causal_mask"])


@pytest.fixture(scope="module")
def wide():
    return check_file(str(HERE / "one_number_wide.py"), only=["causal_mask"])


def test_a_prefix_per_row_or_one_number_passes_with_the_prefix_compared(right):
    (mask,) = right.components
    assert mask.status == "pass", format_report(right)
    assert any("prefix-LM mask" in c.name["en"] for c in mask.checks), format_report(right)


def test_a_prefix_one_column_too_wide_fails_at_its_line(wide):
    (mask,) = wide.components
    assert mask.status == "fail" and [f.line for f in mask.findings] == [7], format_report(wide)
