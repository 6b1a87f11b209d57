"""`handformer check` on a modern speedrun-style layer (nanochat's kind, written here): an attention and
a block whose forward takes `window_size` with no default are handed a window over the whole sequence
(a full-context layer, noted); a QK-norm without gains followed by a fixed factor (`q = q * 1.15`) is
handformer's QK-norm with that gain; a missing QK-norm or a rotary left off the keys fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
CORRECT = Path(__file__).parent / "fixtures" / "learners_windowed" / "correct.py"


def _statuses(path: Path | str):
    result = check_file(str(path))
    return {c.name: c for c in result.components}, format_report(result)


def test_the_windowed_layers_pass_with_the_window_and_gain_said():
    comps, report = _statuses(CORRECT)
    assert {n: c.status for n, c in comps.items()} == {"Attention": "pass", "MLP": "pass",
                                                        "Block": "pass"}, report
    assert report.count("window_size has no default: handed (4096, 0)") == 2, report
    assert "rmsnorm(q) * 1.15 (a fixed gain) -> q_norm" in report


@pytest.mark.parametrize("old, new, line", [
    ("        q, k = rmsnorm(q), rmsnorm(k)\n", "", "line 56: q = q * 1.15"),
    ("q, k = rotate(q, cos, sin), rotate(k, cos, sin)", "q = rotate(q, cos, sin)", "in a helper called from line 55"),
])
def test_a_planted_windowed_layer_fails(tmp_path, old, new, line):
    comps, report = _statuses(edited_copy(tmp_path, CORRECT, [(old, new)]))
    assert comps["Attention"].status == "fail" and comps["Block"].status == "fail", report
    assert line in report, report
