"""One DPO training step in two forms (tests/fixtures/learners_dpo_step/): TRL's concatenated forward of
chosen and rejected with -100 labels, and Hugging Face-style separate forwards with a loss mask and
f-string keys, a dict of metrics returned; a `train_step` that takes a reference model is one too. check drives each with two tiny causal LMs of its own (a
policy and a frozen reference), an SGD optimizer and a batch whose keys it builds from their words;
both pass, and a loss without the reference, with the sides swapped or with the rejected ratio added
FAILs at the line that first departs."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_dpo_step"
PLANTED = {"no_reference": "logits = beta * (pi_chosen - pi_rejected)",
           "sides_swapped": "logits = beta * ((pi_chosen - pi_rejected) - (ref_chosen - ref_rejected))",
           "separate_sign": 'margin = (logps["chosen"] - logps["ref_chosen"]) + (logps["rejected"] - '
                            'logps["ref_rejected"])'}


@pytest.fixture(scope="module")
def checked():
    names = ("correct", "separate_forwards", "named_train_step", *PLANTED)
    return {name: check_file(str(HERE / f"{name}.py")) for name in names}


def step_of(result):
    return next(c for c in result.components if c.kind == "dpo_step")


@pytest.mark.parametrize("name", ["correct", "separate_forwards", "named_train_step"])
def test_a_correct_dpo_step_passes_every_check(checked, name):
    result = checked[name]
    step = step_of(result)
    assert step.status == "pass" and len(step.checks) == 3, format_report(result)
    assert {c.status for c in result.components} == {"pass"}, format_report(result)


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_dpo_step_fails_at_the_line_that_departs(checked, name):
    result = checked[name]
    step = step_of(result)
    assert step.status == "fail", format_report(result)
    assert any(f.code == PLANTED[name] for f in step.findings), format_report(result)
