"""A FAIL quotes the line the mistake is on: the line the first departing tensor is computed on, found
from what departs, not from what a mistake looks like. Each plant edits one line of a fixture and the
FAIL's findings must quote that line: a decoding loop whose model parts from itself on the cached path
(the line inside the model, under the loop's call)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"


def _quoted(tmp_path: Path, source: Path, old: str, new: str, kind: str) -> tuple[set[int], int, str]:
    """The lines the FAIL of `kind` quotes, the planted line, and the report."""
    planted = edited_copy(tmp_path, source, [(old, new)])
    line = next(i for i, text in enumerate(Path(planted).read_text().splitlines(), 1) if new in text)
    result = check_file(planted, only=[kind])
    fails = [c for c in result.components if c.status == "fail"]
    return {f.line for c in fails for f in c.findings}, line, format_report(result)


def test_a_cached_loop_quotes_the_model_line_where_the_cached_path_parts(tmp_path):
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_kvcache" / "correct.py",
                                     "self.future[start:start + t, :k.size(2)]", "self.future[:t, :k.size(2)]",
                                     "generate")
    assert lines == {planted}, report
    assert "in a helper called from line" in report, report
