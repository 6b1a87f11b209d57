"""A Chinese translation model on nn.Transformer, its padded source masked (fixtures/
learners_gnmt_beam_zh/): in eval mode nn.TransformerEncoder takes its fast path and hands nested
tensors between its layers, which the steering hooks must pass over (no NOT CHECKED). Its beam search
(GNMT's length penalty, finished hypotheses kept apart, the beam narrowed as they finish) passes; two
planted mistakes fail, named, at their lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_gnmt_beam_zh"
PLANTS = {"beam_scores_not_accumulated": 84, "beam_first_finished": 97}  # the file, its planted line


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module", params=list(PLANTS))
def planted(request):
    return request.param, check_file(str(HERE / f"{request.param}.py"), only=["beam_search"])


def test_the_model_and_both_decoders_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"PositionalEncoding": "pass", "Seq2Seq": "pass", "greedy_decode": "pass",
                      "beam_search": "pass"}, format_report(correct)
    beam = next(c for c in correct.components if c.name == "beam_search")
    assert beam.convention and "GNMT" in beam.convention["en"], format_report(correct)


def test_a_planted_mistake_fails_at_its_line(planted):
    name, result = planted
    beam = next(c for c in result.components if c.name == "beam_search")
    lines = [f.line for f in beam.findings]
    assert beam.status == "fail" and PLANTS[name] in lines, format_report(result)
