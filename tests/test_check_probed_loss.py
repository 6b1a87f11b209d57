"""A loss found by what it does (a number near the cross-entropy) FAILs only on a catalogued mistake:
one that shifts its labels inside and reads its own ignore id (-100) is handed one position more and
its padding so marked, and passes, never FAIL."""

from __future__ import annotations

from pathlib import Path

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_probed_loss"


def test_a_probed_loss_that_shifts_inside_passes():
    result = check_file(str(HERE / "shift_inside.py"))
    status = {c.name: c.status for c in result.components}
    assert status == {"token_objective": "pass"}, format_report(result)
    assert "it shifts the labels itself" in format_report(result)
    assert "by what it does" in format_report(result)
