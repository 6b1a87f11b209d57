"""A Chinese tutorial's comment that writes the formula as an assignment (`# freq = 1 /
10000^(2i/d_model)，用 exp 和 log 算`) is prose, not a statement turned off: a finding below it is quoted
at its own line (fixtures/learners_zh_comments/)."""

from __future__ import annotations

from pathlib import Path

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_zh_comments"


def test_a_formula_comment_is_not_quoted_as_code_turned_off():
    result = check_file(str(HERE / "pe_sin_cos_swapped.py"))
    found = [(f.name, f.line) for c in result.components for f in c.findings]
    assert found == [("pe_sin_cos_swapped", 16)], format_report(result)


def test_the_correct_table_passes():
    result = check_file(str(HERE / "correct.py"))
    assert [c.status for c in result.components] == ["pass"], format_report(result)
