"""Soft-capped attention logits written in a helper of the file (fixtures/learners_softcap_helper/): the
forward reads its cap and calls a function of its file that takes the tanh, so the cap is the
attention's convention and it passes; a helper that forgets to divide by the cap FAILs at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_softcap_helper"


@pytest.mark.parametrize("name, status, lines", [("softcap_helper.py", "pass", set()),
                                                 ("softcap_helper_p_undivided.py", "fail", {13})])
def test_a_soft_cap_in_a_helper_is_the_attentions_convention(name, status, lines):
    report = check_file(str(HERE / name), only=["causal_attention"])
    (attn,) = report.components
    assert attn.status == status and {f.line for f in attn.findings} == lines, format_report(report)
