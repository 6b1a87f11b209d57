"""A score scale that is a root bound on its own line (fixtures/learners_scale_bound/): where the root of
the wrong size is taken (`self.norm_factor = math.sqrt(d_model)` in __init__, `denom = C ** 0.5` in
forward), the FAIL quotes that binding, not the line that divides by it, which is right as written.
The heads split by a comprehension whose variable is named `k` (`[k.view(...) for k in (q, k, v)]`)
are no keys holding the queries: a loop's variable takes each value in turn."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_scale_bound"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"), only=["mha", "causal_attention"])


@pytest.fixture(scope="module")
def mha_root_of_width():
    return check_file(str(HERE / "mha_root_of_width.py"), only=["mha"])


@pytest.fixture(scope="module")
def causal_root_of_width():
    return check_file(str(HERE / "causal_root_of_width.py"), only=["causal_attention"])


def _line(text: str, result) -> int:
    return next(n for n, line in enumerate(Path(result.path).read_text().splitlines(), 1) if text in line)


def test_both_attentions_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"MultiHeadAttention": "pass", "CausalSelfAttention": "pass"}, format_report(correct)


@pytest.mark.parametrize("planted, text", [("mha_root_of_width", "self.norm_factor = math.sqrt(d_model)"),
                                           ("causal_root_of_width", "denom = C ** 0.5")])
def test_the_root_of_the_wrong_size_is_quoted_where_it_is_bound(planted, text, request):
    result = request.getfixturevalue(planted)
    (attention,) = result.components
    found = [(f.name, f.line) for f in attention.findings]
    assert attention.status == "fail" and found == [("scale_by_dk", _line(text, result))], format_report(result)
