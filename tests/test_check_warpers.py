"""Hugging Face-style logits warpers (fixtures/learners_warpers/): MinPLogitsWarper(min_p) and
TypicalLogitsWarper(mass), each found as a processor by its constructor's setting and checked as its
filter. Locally typical sampling is a filter of its own (the tokens whose surprisal is nearest the
entropy, until their mass is reached): correct, both pass; each plant fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.runners.sampling import typical_keep

HERE = Path(__file__).parent / "fixtures" / "learners_warpers"
# the file -> (the component that fails, its planted line)
PLANTS = {"typical_sorted_farthest_first": ("TypicalLogitsWarper", 38),
          "typical_entropy_sign": ("TypicalLogitsWarper", 36),
          "min_p_not_scaled": ("MinPLogitsWarper", 19)}


@pytest.fixture(scope="module", params=["correct", *PLANTS])
def checked(request):
    return request.param, check_file(str(HERE / f"{request.param}.py"), only=["min_p", "typical"])


def test_each_warper_passes_or_fails_at_its_planted_line(checked):
    name, result = checked
    status = {c.name: c.status for c in result.components}
    failing, line = PLANTS.get(name, ("", None))
    assert status == {w: "fail" if w == failing else "pass" for w in ("MinPLogitsWarper", "TypicalLogitsWarper")}, \
        format_report(result)
    assert [f.line for c in result.components for f in c.findings] == [line] * bool(line), format_report(result)


def test_typical_keeps_the_tokens_nearest_the_entropy_until_the_mass():
    import torch
    # probabilities 0.5, 0.3, 0.2: entropy 1.03 nats; surprisals 0.69, 1.20, 1.61, nearest first 1, 0, 2
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    assert typical_keep(logits, 0.25).tolist() == [[False, True, False]]
    assert typical_keep(logits, 0.5).tolist() == [[True, True, False]]
    assert typical_keep(logits, 0.99).tolist() == [[True, True, True]]
