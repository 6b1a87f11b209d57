"""`handformer check` on a model's own generate() that samples with a temperature and a top-p (the
Hugging Face ports' method), and a min-p sampler `min_p_sample(logits, min_p)` found by what a call
returns. The loop is driven once more at top_p = 0.6 and the tokens it keeps are counted against
top-p's nucleus (it samples from them sorted: counts, not places); a loop that drops the crossing token
and a min-p whose threshold is not scaled by the likeliest token are each named at their line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_nucleus_loops"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module")
def top_p_crossing():
    return check_file(str(HERE / "top_p_crossing.py"), only=["generate"])


@pytest.fixture(scope="module")
def min_p_unscaled():
    return check_file(str(HERE / "min_p_unscaled.py"), only=["sample"])


def test_the_loop_and_the_min_p_sampler_are_checked_and_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"TinyCausalLM": "pass", "min_p_sample": "pass", "TinyCausalLM.generate": "pass"}, (
        format_report(correct))
    loop = next(c for c in correct.components if c.name == "TinyCausalLM.generate")
    assert any("top_p=0.6" in check.name["en"] and check.ok for check in loop.checks), format_report(correct)


def test_a_loop_that_drops_the_crossing_token_is_named_at_its_line(top_p_crossing):
    (loop,) = top_p_crossing.components
    assert loop.status == "fail", format_report(top_p_crossing)
    assert [(f.name, f.line) for f in loop.findings] == [("top_p_drops_crossing", 33)], format_report(top_p_crossing)


def test_a_min_p_threshold_not_scaled_is_named_at_its_line(min_p_unscaled):
    (sampler,) = min_p_unscaled.components
    assert sampler.status == "fail", format_report(min_p_unscaled)
    assert [(f.name, f.line) for f in sampler.findings] == [("min_p_not_scaled", 43)], format_report(min_p_unscaled)
