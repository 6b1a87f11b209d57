"""`handformer check` on Hugging Face's learning-rate factories on a LambdaLR and one epoch of a
language model's micro-batches: get_inverse_sqrt_schedule(optimizer, num_warmup_steps, timescale) is
found as a schedule by its inverse square root (it names no end), and `fit(model, train_loader,
optimizer, scheduler, grad_accum, clip_norm, scaler)`, an epoch whose model scores its own targets
(`model(xb, yb)`), is driven as a training step on a loader of that step's micro-batches. A loss not
divided by the micro-batches, the inverse square root's ratio turned over and a cosine whose progress
counts from step 0 are each named at their line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_hf_schedules"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module")
def loss_not_divided():
    return check_file(str(HERE / "loss_not_divided.py"), only=["lm_train_step"])


@pytest.fixture(scope="module")
def inverse_sqrt_flipped():
    return check_file(str(HERE / "inverse_sqrt_flipped.py"), only=["schedule"])


@pytest.fixture(scope="module")
def cosine_from_zero():
    return check_file(str(HERE / "cosine_from_zero.py"), only=["schedule"])


def _named(report, name):
    component = next(c for c in report.components if c.name == name)
    return component.status, [(f.name, f.line) for f in component.findings]


def test_both_schedules_and_the_epoch_are_checked_and_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"TinyLM": "driver", "get_cosine_schedule_with_warmup": "pass",
                      "get_inverse_sqrt_schedule": "pass", "fit": "pass"}, format_report(correct)


def test_a_loss_not_divided_by_the_micro_batches_is_named_at_its_line(loss_not_divided):
    assert _named(loss_not_divided, "fit") == ("fail", [("train_step_loss_not_divided", 56)]), (
        format_report(loss_not_divided))


def test_the_inverse_square_root_turned_over_is_named_at_its_line(inverse_sqrt_flipped):
    assert _named(inverse_sqrt_flipped, "get_inverse_sqrt_schedule") == (
        "fail", [("schedule_exponent_sign", 30)]), format_report(inverse_sqrt_flipped)


def test_a_cosine_counted_from_step_zero_is_named_at_its_progress(cosine_from_zero):
    assert _named(cosine_from_zero, "get_cosine_schedule_with_warmup") == (
        "fail", [("cosine_from_step_zero", 15)]), format_report(cosine_from_zero)
