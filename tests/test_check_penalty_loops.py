"""`handformer check` on generation loops that take a repetition penalty, in two forms: a model's own
greedy generate() that gathers the seen tokens' logits and scatters them back, and a free sampling
function that rescales each row's distinct tokens one at a time (runners/generate_penalty.py).

The loop's other runs hand it penalty 1, where CTRL's rule and its mistakes compute the same. It is
driven once more at penalty 1.5 on prompts that repeat a token, its model's logits less their median
(both signs among the seen tokens), and the scores its argmax or its draw is handed are compared with the
rule: a loop that multiplies the positive logits (the rule the wrong way round), or divides every one,
is named and quoted at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_penalty_loops"
LOOPS = {"EchoLM.generate": "repetition_penalty=1.5", "sample_penalized": "repeat_penalty=1.5"}
# planted file -> (the loop that fails, the finding it names, the planted line)
PLANTS = {"method_inverted": ("EchoLM.generate", "repetition_penalty_inverted", 32),
          "function_divided": ("sample_penalized", "repetition_penalty_sign_ignored", 46)}


@pytest.fixture(scope="module")
def checked():
    return {name: check_file(str(HERE / f"{name}.py"), only=["generate"]) for name in ["correct", *PLANTS]}


def _loops(result):
    return {c.name: c for c in result.components if c.name in LOOPS}


def test_both_loops_follow_the_rule_at_a_penalty_that_shows_it(checked):
    result = checked["correct"]
    loops = _loops(result)
    assert {name: c.status for name, c in loops.items()} == dict.fromkeys(LOOPS, "pass"), format_report(result)
    for name, c in loops.items():
        assert any(check.name["en"].startswith(LOOPS[name]) and check.ok for check in c.checks), format_report(result)


@pytest.mark.parametrize("name", list(PLANTS))
def test_a_penalty_in_a_catalogued_wrong_form_is_named_at_its_line(checked, name):
    result = checked[name]
    failing, finding, line = PLANTS[name]
    status = {n: c.status for n, c in _loops(result).items()}
    assert status == {**dict.fromkeys(LOOPS, "pass"), failing: "fail"}, format_report(result)
    assert [(f.name, f.line) for f in _loops(result)[failing].findings] == [(finding, line)], format_report(result)
