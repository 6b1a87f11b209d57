"""A partial rotary written with module-level sizes (fixtures/learners_partial_rotary_globals/): the share
of each head it turns is named only in a comment (`# rotary_pct = 0.25`), which is no config that goes
unread; its attention, built at check's sizes, passes."""

from __future__ import annotations

from pathlib import Path

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_partial_rotary_globals"


def test_a_rotary_share_named_in_a_comment_is_no_unread_config():
    report = check_file(str(HERE / "neox_globals.py"), only=["causal_attention"])
    (attn,) = report.components
    assert attn.status == "pass" and not attn.findings, format_report(report)
