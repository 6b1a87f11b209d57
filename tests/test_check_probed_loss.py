"""A loss found by what it does (a number near the cross-entropy) FAILs only on a catalogued mistake:
one that shifts its labels inside computes another loss, and is NOT CHECKED, never FAIL."""

from __future__ import annotations

from pathlib import Path

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_probed_loss"


def test_a_probed_loss_that_shifts_inside_is_not_failed():
    result = check_file(str(HERE / "shift_inside.py"))
    status = {c.name: c.status for c in result.components}
    assert status == {"token_objective": "not_checked"}, format_report(result)
    assert "found by what it does" in format_report(result)
