"""An attention whose forward takes an optional mask it never reads (fixtures/learners_unread_mask/): it
takes no mask, so check hands it none and grades the causal mask it builds itself; a wrong score scale
in the same form still FAILs at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_unread_mask"


@pytest.mark.parametrize("name, status, lines", [("causal_unused_mask.py", "pass", []),
                                                 ("causal_unused_mask_scale.py", "fail", [24])])
def test_an_optional_mask_never_read_is_not_handed(name, status, lines):
    report = check_file(str(HERE / name), only=["mha"])
    (attn,) = report.components
    assert attn.status == status, format_report(report)
    assert [f.line for f in attn.findings] == lines and all(f.name == "scale_by_dk" for f in attn.findings), \
        format_report(report)
