"""A decoder-only beam search as Hugging Face's BeamSearchScorer runs it (fixtures/
learners_hf_beam_hyps/): the beams as one batch, all but the first at -1e9, the 2 * num_beams best
pairs a step, finished hypotheses kept in a BeamHypotheses object. It passes; the scores not summed
(the log-softmax alone, batched) and the first finished hypothesis returned fail, named, each at its
line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_hf_beam_hyps"
PLANTS = {"beam_scores_not_accumulated": 87, "beam_first_finished": 108}  # the file and mistake, its line


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"), only=["gpt", "beam_search"])


@pytest.fixture(scope="module", params=list(PLANTS))
def planted(request):
    return request.param, check_file(str(HERE / f"{request.param}.py"), only=["gpt", "beam_search"])


def test_an_hf_style_beam_search_passes(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"GPT": "pass", "beam_search": "pass"}, format_report(correct)


def test_a_planted_mistake_fails_named_at_its_line(planted):
    name, result = planted
    beam = next(c for c in result.components if c.name == "beam_search")
    found = {f.name: f.line for f in beam.findings}
    expected = name.replace("beam_first_finished", "beam_shortest_returned")
    assert beam.status == "fail" and found.get(expected) == PLANTS[name], format_report(result)
