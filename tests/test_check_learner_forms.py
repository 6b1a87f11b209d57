"""Loops driven in the form the learner's file hands them (tests/fixtures/learners_finish_reason/):

- a sampler that returns its tokens beside why it stopped, an API's finish_reason ("stop" or
  "length"), is read as its tokens: a list of one prompt's new ids (over a model of the file's own)
  and a (B, T + n) tensor (over a model that returns `.logits`); each checked, and a planted
  mistake in each fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FOLDER = Path(__file__).parent / "fixtures" / "learners_finish_reason"
# name: (fixture, edits)
CASES = {
    "api_sampler": ("api_sampler", ()),
    "api_sampler_first": ("api_sampler", (("[0, -1, :]", "[0, 0, :]"),)),
    "reason_loop": ("reason_loop", ()),
    "reason_loop_prepended": ("reason_loop", (("[input_ids, next_ids]", "[next_ids, input_ids]"),)),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learner_forms")
    return {name: check_file(planted_copy(folder, name, FOLDER / f"{fixture}.py", *edits), only=["generate"])
            for name, (fixture, edits) in CASES.items()}


@pytest.mark.parametrize("name", ["api_sampler", "reason_loop"])
def test_a_loop_that_says_why_it_stopped_is_checked_and_passes(results, name):
    (loop,) = results[name].components
    assert loop.status == "pass", format_report(results[name])


@pytest.mark.parametrize(("name", "line"), [("api_sampler_first", "[0, 0, :]"),
                                            ("reason_loop_prepended", "[next_ids, input_ids]")])
def test_a_planted_loop_that_says_why_it_stopped_fails_at_its_line(results, name, line):
    (loop,) = results[name].components
    report = format_report(results[name])
    assert loop.status == "fail", report
    assert line in report, report
