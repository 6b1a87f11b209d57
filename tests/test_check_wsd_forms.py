"""Warmup-stable-decay schedules in two forms (tests/fixtures/learners_wsd_groups/): nanoGPT's
`get_lr(it, ...)` with its warmup (t + 1) / (T_w + 1) and a cosine decay, and MiniCPM's factor for a
LambdaLR, the same warmup written in a function the scheduler factory calls. Both pass with that
warmup reported as nanoGPT's; a decay that starts at the warmup's end, or that rises, FAILs at its
line. A step over a list of micro-batches whose model is handed x alone and whose loss scores y
flattened over the tokens is a language model's step with gradient accumulation, in two forms
(nanoGPT's parameter groups and `for x, y in micro_batches`; `for i, (xb, yb) in enumerate(batches)`):
both pass, and a loss not divided by the number of micro-batches is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_wsd_groups"
PLANTED = {"decay_from_warmup": "progress = (it - warmup_iters) / decay_iters",
           "lambda_decay_up": "return min_ratio + (1.0 - min_ratio) * done"}
NOT_DIVIDED = ("accum_not_divided", "enumerated_not_divided")


@pytest.fixture(scope="module")
def checked():
    names = ("correct", "lambda_form", "enumerated_step", *PLANTED, *NOT_DIVIDED)
    return {name: check_file(str(HERE / f"{name}.py")) for name in names}


def schedules(result):
    return [c for c in result.components if c.kind == "schedule"]


@pytest.mark.parametrize("name", ["correct", "lambda_form"])
def test_nanogpt_warmup_in_a_wsd_is_a_convention(checked, name):
    result = checked[name]
    found = schedules(result)
    assert found and {c.status for c in found} == {"pass"}, format_report(result)
    assert all("(t + 1) / (T_w + 1) (nanoGPT)" in str(c.convention) for c in found), format_report(result)


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_a_planted_decay_fails_at_its_line(checked, name):
    result = checked[name]
    failed = [c for c in schedules(result) if c.status == "fail"]
    assert failed, format_report(result)
    assert any(PLANTED[name] in (f.code or "") for c in failed for f in c.findings), format_report(result)


@pytest.mark.parametrize("name", ["correct", "enumerated_step"])
def test_a_step_over_micro_batches_is_a_language_models_step(checked, name):
    result = checked[name]
    step = next(c for c in result.components if c.name == "train_step")
    assert step.kind == "lm_train_step" and step.status == "pass", format_report(result)
    assert any("micro-batches" in str(n) for n in step.notes), format_report(result)


@pytest.mark.parametrize("name", NOT_DIVIDED)
def test_a_loss_not_divided_by_the_micro_batches_is_named(checked, name):
    result = checked[name]
    step = next(c for c in result.components if c.name == "train_step")
    assert step.status == "fail", format_report(result)
    assert "train_step_loss_not_divided" in {f.name for f in step.findings}, format_report(result)
