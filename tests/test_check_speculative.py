"""Speculative decoding in the DeepMind paper's notation (tests/fixtures/learners_speculative/correct.py:
q the draft, p the target). It is driven with two stand-in models certain of their next token, so its
tokens are known whatever it draws: a draft that agrees is always accepted, one that disagrees always
rejected and replaced by the target's token. A residual subtracted the wrong way round gives the
draft's tokens and FAILs at the line that subtracts; an acceptance ratio turned over accepts the
draft's tokens and ends each round with the target's, and FAILs at the line that takes the ratio. The
file's `sample(probs)` (torch.multinomial) is a sampling step every time, never greedy."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_results import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_speculative" / "correct.py"
PLANTS = {  # name -> (the line as written, the line planted, the line quoted or None)
    "residual_swapped": ("residual = torch.clamp(p[0, n + i - 1] - q[0, n + i - 1], min=0.0)",
                         "residual = torch.clamp(q[0, n + i - 1] - p[0, n + i - 1], min=0.0)", True),
    "ratio_turned_over": ("torch.clamp(p[0, n + i - 1, x] / q[0, n + i - 1, x], max=1.0)",
                          "torch.clamp(q[0, n + i - 1, x] / p[0, n + i - 1, x], max=1.0)", True),
}


@pytest.fixture(scope="module")
def correct():
    return check_file(str(CORRECT))


@pytest.fixture(scope="module", params=sorted(PLANTS))
def planted(request, tmp_path_factory):
    written, plant, quoted = PLANTS[request.param]
    folder = tmp_path_factory.mktemp("speculative")
    return plant, quoted, planted_copy(CORRECT, folder, request.param, (written, plant))


def test_speculative_decoding_and_its_sampler_pass(correct):
    kinds = {c.name: (c.kind, c.status) for c in correct.components}
    assert kinds["speculative_decoding"] == ("speculative", "pass"), format_report(correct)
    assert kinds["sample"] == ("sample", "pass"), format_report(correct)
    spec = next(c for c in correct.components if c.name == "speculative_decoding")
    assert len(spec.checks) == 2


def test_a_wrong_acceptance_or_residual_fails(planted):
    plant, quoted, result = planted
    spec = next(c for c in result.components if c.name == "speculative_decoding")
    assert spec.status == "fail", format_report(result)
    assert any(plant in (f.code or "") for f in spec.findings) == quoted, format_report(result)
