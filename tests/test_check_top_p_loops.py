"""`handformer check` on sampling loops that take a top-p, in two forms: a model's own generate() that
removes the sorted tokens whose cumulative probability passes p and shifts the removal right (the
Hugging Face ports'), and a free function that zeroes the sorted probabilities whose mass ranked above
passes p (Meta's sample_top_p). Driven at top_p = 0.6, a loop that keeps another count than the nucleus,
in no catalogued form, is quoted at the line that compares the cumulative mass with p."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.result import DEPARTS
from handformer.check.runners.generate_top_p import mass_line

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_top_p_loops"
LOOPS = {"NucleusLM.generate", "nucleus_decode"}


def _checked(name):
    return check_file(str(HERE / f"{name}.py"), only=["generate"])


@pytest.fixture(scope="module")
def correct():
    return _checked("correct")


@pytest.fixture(scope="module")
def method_reversed():
    return _checked("method_reversed")


@pytest.fixture(scope="module")
def function_reversed():
    return _checked("function_reversed")


def test_both_loops_keep_the_nucleus_and_pass(correct):
    loops = {c.name: c for c in correct.components if c.name in LOOPS}
    assert {name: c.status for name, c in loops.items()} == dict.fromkeys(LOOPS, "pass"), format_report(correct)
    assert all(any("top_p=0.6" in check.name["en"] and check.ok for check in c.checks)
               for c in loops.values()), format_report(correct)


@pytest.mark.parametrize(("fixture", "failing", "line"), [("method_reversed", "NucleusLM.generate", 35),
                                                         ("function_reversed", "nucleus_decode", 52)])
def test_a_comparison_with_p_turned_is_quoted_at_its_line(request, fixture, failing, line):
    result = request.getfixturevalue(fixture)
    status = {c.name: c.status for c in result.components if c.name in LOOPS}
    assert status == {**dict.fromkeys(LOOPS, "pass"), failing: "fail"}, format_report(result)
    loop = next(c for c in result.components if c.name == failing)
    assert [(f.name, f.line) for f in loop.findings] == [(DEPARTS, line)], format_report(result)
    assert "nucleus holds" in loop.findings[0].observed["en"], format_report(result)


def test_the_mass_line_is_the_first_comparison_of_a_cumulative_sum_with_p():
    lines = [(1, "    if top_p < 1.0:"), (2, "    cum = probs.cumsum(-1)"), (3, "    # drop = cum > top_p"),
             (4, "    drop = top_p < cum - probs")]
    assert mass_line(lines) == (4, "drop = top_p < cum - probs")
    assert mass_line(lines[:3]) == (None, None)
    assert mass_line([(1, "    pos = mask.cumsum(-1) - 1"), *lines[:1]]) == (None, None)  # positions, not mass
