"""A mistake's line is looked for first in the lines that ran while check drove the component
(fixtures/learners_fast_path/: a slow reference attention kept beside the chunked fast path the module
calls, `fast_attention(...) if self.fast else slow_attention(...)`). The planted off-by-one causal
mask in the fast path is quoted there, not the reference's `triu` line that never ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_fast_path"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module")
def sees_next():
    return check_file(str(HERE / "sees_next.py"))


def test_the_fast_path_passes(correct):
    assert [c.status for c in correct.components] == ["pass"], format_report(correct)


def test_the_mistake_is_quoted_on_the_path_that_ran(sees_next):
    (attention,) = sees_next.components
    assert attention.status == "fail", format_report(sees_next)
    assert [(f.name, f.line) for f in attention.findings] == [("causal_off_by_one", 31)], format_report(sees_next)
    assert "key_pos > query_pos + 1" in attention.findings[0].code
