"""Speculative decoding in the DeepMind paper's notation (tests/fixtures/learners_speculative/correct.py:
q the draft, p the target). It is driven with two stand-in models certain of their next token, so its
tokens are known whatever it draws: a draft that agrees is always accepted, one that disagrees always
rejected and replaced by the target's token. A residual subtracted the wrong way round gives the
draft's tokens and FAILs at the line that subtracts; an acceptance ratio turned over accepts the
draft's tokens and ends each round with the target's, and FAILs at the line that takes the ratio. The
file's `sample(probs)` (torch.multinomial) is a sampling step every time, never greedy.

Certain models cannot tell the residual from the target's distribution, nor a temperature that
multiplies from one that divides: the first new token of many seeded runs with soft stand-ins must
follow the target's distribution, on this fixture and on a second form (learners_speculative_batched:
all k accepted at once, models returning (logits, loss), a comment that speaks of `out.logits`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_results import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_speculative" / "correct.py"
BATCHED = Path(__file__).parent / "fixtures" / "learners_speculative_batched" / "correct.py"
PLANTS = {  # name -> (the line as written, the line planted, the line quoted or None)
    "residual_is_the_target": ("new_tokens.append(sample(residual / residual.sum()).view(1, 1))",
                               "new_tokens.append(sample(p[0, n + i - 1]).view(1, 1))", False),
    "residual_swapped": ("residual = torch.clamp(p[0, n + i - 1] - q[0, n + i - 1], min=0.0)",
                         "residual = torch.clamp(q[0, n + i - 1] - p[0, n + i - 1], min=0.0)", True),
    "ratio_turned_over": ("torch.clamp(p[0, n + i - 1, x] / q[0, n + i - 1, x], max=1.0)",
                          "torch.clamp(q[0, n + i - 1, x] / p[0, n + i - 1, x], max=1.0)", True),
}


@pytest.fixture(scope="module")
def correct():
    return check_file(str(CORRECT))


BATCHED_PLANTS = {  # name -> (the line as written, the line planted)
    "residual_is_the_target": ("extra = torch.multinomial(leftover / leftover.sum(), 1)",
                               "extra = torch.multinomial(p[kept], 1)"),
    "temperature_multiplied": ("F.softmax(logits / temperature", "F.softmax(logits * temperature"),
}


@pytest.fixture(scope="module")
def batched():
    return check_file(str(BATCHED))


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
    assert len(spec.checks) == 3 and all(c.ok for c in spec.checks)


def test_a_wrong_acceptance_or_residual_fails(planted):
    plant, quoted, result = planted
    spec = next(c for c in result.components if c.name == "speculative_decoding")
    assert spec.status == "fail", format_report(result)
    assert any(plant in (f.code or "") for f in spec.findings) == quoted, format_report(result)


def test_a_second_form_passes_in_distribution(batched):
    spec = next(c for c in batched.components if c.name == "speculative_generate")
    assert (spec.kind, spec.status, len(spec.checks)) == ("speculative", "pass", 3), format_report(batched)


@pytest.mark.parametrize("name", sorted(BATCHED_PLANTS))
def test_a_second_form_with_a_wrong_residual_or_temperature_fails_in_distribution(name, tmp_path):
    result = planted_copy(BATCHED, tmp_path, name, BATCHED_PLANTS[name])
    spec = next(c for c in result.components if c.name == "speculative_generate")
    assert spec.status == "fail", format_report(result)
    assert [c.ok for c in spec.checks] == [True, True, False], format_report(result)
