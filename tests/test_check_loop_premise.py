"""A loop's named mistake only where its premise was offered in the form the loop reads it, on check's
own run: generate_does_not_stop where the loop was handed its count (by a name, or as the parameter its
`for ... in range(...)` or `while` test counts by) and went on past it; a loop that calls the model
twice a token (classifier-free guidance) finishes, and at a scale that is not neutral is NOT CHECKED,
never FAIL; one that calls it eight times a token (Monte Carlo dropout) is stopped, NOT CHECKED. generate_no_crop where the loop crops by a limit it reads (in a slice, in a helper of its
own) or takes one it never uses; a loop that stops at the limit is run past it; a loop that reads the
limit only to size a draft is not. Loops that really do not stop, or do not crop, still FAIL named at
their line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_loop_premise"
# fixture -> (status, the findings named, at their lines)
EXPECTED = {
    "count_by_range": ("pass", None, None), "count_by_while": ("pass", None, None),
    "count_by_while_no_stop": ("fail", "generate_does_not_stop", 9),
    "guidance_two_passes": ("pass", None, None), "guidance_weight": ("not_checked", None, None),
    "guidance_no_stop": ("fail", "generate_does_not_stop", 11),
    "draft_room": ("pass", None, None), "stop_at_block": ("pass", None, None), "crop_helper": ("pass", None, None),
    "crop_helper_first": ("fail", "generate_no_crop", 7), "unused_limit": ("fail", "generate_no_crop", 9),
    "own_count": ("not_checked", None, None), "mc_dropout": ("not_checked", None, None),
    "while_not_appended": ("fail", "generate_does_not_stop", 9),  # and generate_not_appended, line 11
}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=["generate"]) for name in EXPECTED}


@pytest.mark.parametrize("name", EXPECTED)
def test_a_loop_is_charged_only_where_its_premise_was_offered(results, name):
    (comp,) = results[name].components
    status, finding, line = EXPECTED[name]
    assert comp.status == status, format_report(results[name])
    assert [(f.name, f.line) for f in comp.findings][:1] == ([(finding, line)] if finding else [])


def test_the_count_read_by_form_and_the_crop_are_said(results):
    notes = {name: " ".join(n["en"] for n in results[name].components[0].notes) for name in EXPECTED}
    assert "reads the block size but neither crops by it nor stops at it" in notes["draft_room"]
    assert "it stops once the context holds the block's 8 tokens" in notes["stop_at_block"]
    assert "its decode_budget is handed the number of new tokens" in notes["count_by_range"]
    assert "past the block size" not in notes["crop_helper"]  # run past it, and right there
    checks = " ".join(c.name["en"] for c in results["crop_helper"].components[0].checks)
    assert "7 new tokens" in checks
    error = results["guidance_weight"].components[0].error
    assert "more than one pass a token" in error.message and "classifier-free guidance" in error.message
    assert "无分类器引导" in error.message_zh
    uncounted = results["own_count"].components[0].error
    assert "takes no count of new tokens check can hand it" in uncounted.message
    stalled = results["mc_dropout"].components[0].error
    assert "called the model 28 times without going past the tokens it was asked for" in stalled.message
