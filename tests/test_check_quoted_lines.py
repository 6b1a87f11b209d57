"""A FAIL quotes the line the mistake is on: the line the first departing tensor is computed on, found
from what departs, not from what a mistake looks like. Each plant edits one line of a fixture and the
FAIL's findings must quote that line: a decoding loop whose model parts from itself on the cached path
(the line inside the model, under the loop's call); a helper right in another call (the line calling
it); a named mistake whose patterns match several lines of the class (the one that departs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"


def _quoted(tmp_path: Path, source: Path, old: str, new: str, kind: str, more: tuple[tuple[str, str], ...] = (),
            ) -> tuple[set[int], int, str]:
    """The lines the FAIL of `kind` quotes, the planted line (the last line of `new`), and the report;
    `more`: edits that are not the mistake (a helper the planted line sits in)."""
    planted = edited_copy(tmp_path, source, [*more, (old, new)])
    mark = new.splitlines()[-1].strip()
    line = next(i for i, text in enumerate(Path(planted).read_text().splitlines(), 1) if mark in text)
    result = check_file(planted, only=[kind])
    fails = [c for c in result.components if c.status == "fail"]
    return {f.line for c in fails for f in c.findings}, line, format_report(result)


def test_a_cached_loop_quotes_the_model_line_where_the_cached_path_parts(tmp_path):
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_kvcache" / "correct.py",
                                     "self.future[start:start + t, :k.size(2)]", "self.future[:t, :k.size(2)]",
                                     "generate")
    assert lines == {planted}, report
    assert "in a helper called from line" in report, report


def test_a_shared_helper_given_the_wrong_weights_quotes_the_line_that_calls_it(tmp_path):
    """One RMSNorm class normalizes q and k: k through q's norm departs inside the norm's forward, yet
    the same forward gave the reference's q; the line calling it is quoted."""
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_minimind_qk" / "correct.py",
                                     "self.q_norm(xq), self.k_norm(xk)", "self.q_norm(xq), self.q_norm(xk)", "gqa")
    assert lines == {planted}, report


def test_a_named_mistake_matching_several_lines_is_quoted_where_the_heads_depart(tmp_path):
    """A helper splitting the heads in two `.view(..., n_heads, ...)` lines, the second viewing the
    first as (B, h, T, d_k): both look like split_no_transpose; the second is where the heads depart."""
    helper = ("    def split(self, x, batch_size):\n"
              "        x = x.view(batch_size, -1, self.n_heads, self.d_k)\n"
              "        return x.transpose(1, 2)\n\n    def forward(self, q, k, v, mask=None):")
    calls = [(f"{n} = self.w_{n.lower()}({n.lower()}).view(batch_size, -1, self.n_heads, self.d_k).transpose(1, 2)",
              f"{n} = self.split(self.w_{n.lower()}({n.lower()}), batch_size)") for n in "QKV"]
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners" / "correct.py", "return x.transpose(1, 2)",
                                     "return x.view(batch_size, self.n_heads, -1, self.d_k)", "mha",
                                     (("    def forward(self, q, k, v, mask=None):", helper), *calls))
    assert lines == {planted} and "split_no_transpose" in report, report
