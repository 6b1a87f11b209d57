"""`handformer check` on sampling loops that take a top-k, in two forms: a model's own generate()
that thresholds at the k-th largest logit (nanoGPT's), and a free function that ranks the logits with a
sort and keeps them with torch.where. The runs at top_k = 1 see a model whose likeliest token is
certain, which hides a filter that keeps the wrong tokens; the loop is driven once more at top_k = 5 on
its model's logits as they are, and a filter that keeps other tokens is quoted at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.result import DEPARTS
from handformer.check.runners.generate_top_k import filter_line

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_top_k_loops"
LOOPS = {"PocketLM.generate", "sample_with_top_k"}


def _checked(name):
    return check_file(str(HERE / f"{name}.py"), only=["generate"])


@pytest.fixture(scope="module")
def correct():
    return _checked("correct")


@pytest.fixture(scope="module")
def method_inverted():
    return _checked("method_inverted")


@pytest.fixture(scope="module")
def function_inverted():
    return _checked("function_inverted")


def test_both_loops_keep_the_k_likeliest_tokens_and_pass(correct):
    loops = {c.name: c for c in correct.components if c.name in LOOPS}
    assert {name: c.status for name, c in loops.items()} == dict.fromkeys(LOOPS, "pass"), format_report(correct)
    assert all(any("top_k=5" in check.name["en"] and check.ok for check in c.checks)
               for c in loops.values()), format_report(correct)


@pytest.mark.parametrize(("fixture", "failing", "line"), [("method_inverted", "PocketLM.generate", 33),
                                                         ("function_inverted", "sample_with_top_k", 46)])
def test_a_filter_that_keeps_other_tokens_is_quoted_at_its_line(request, fixture, failing, line):
    result = request.getfixturevalue(fixture)
    status = {c.name: c.status for c in result.components if c.name in LOOPS}
    assert status == {**dict.fromkeys(LOOPS, "pass"), failing: "fail"}, format_report(result)
    loop = next(c for c in result.components if c.name == failing)
    assert [(f.name, f.line) for f in loop.findings] == [(DEPARTS, line)], format_report(result)
    assert "top-k keeps" in loop.findings[0].observed["en"], format_report(result)


def test_the_filter_line_is_the_first_write_after_the_ranking():
    lines = [(1, "    v, _ = torch.topk(logits, k)"), (2, "    # logits[...] = -inf"),
             (3, "    cut = v[:, -1:]"), (4, "    logits = logits.masked_fill(logits < cut, -1e9)")]
    assert filter_line(lines) == (4, "logits = logits.masked_fill(logits < cut, -1e9)")
    assert filter_line(lines[:3]) == (1, "v, _ = torch.topk(logits, k)")
    assert filter_line([(5, "    probs = logits.softmax(-1)")]) == (None, None)
