"""A step whose batch is one tensor of windows (B, T + 1) that it chunks into micro-batches, with a
loss helper of (model, windows) that shifts them (tests/fixtures/learners_token_batch/correct.py):
the step is driven with such a tensor and passes; the helper, which calls the model, is NOT
CHECKED (never a FAIL); the loss not divided by the micro-steps FAILs at its line."""

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_token_batch" / "correct.py"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(CORRECT))


def test_the_step_and_the_loss_of_the_model_pass(correct):
    by_name = {c.name: c for c in correct.components}
    assert by_name["train_step"].kind == "lm_train_step" and by_name["train_step"].status == "pass", \
        format_report(correct)
    assert by_name["lm_loss"].status == "pass", format_report(correct)


def test_the_loss_not_divided_fails_at_its_line(tmp_path):
    planted = tmp_path / "not_divided.py"
    planted.write_text(CORRECT.read_text().replace("(loss / accum_steps).backward()", "loss.backward()"))
    result = check_file(str(planted))
    step = next(c for c in result.components if c.name == "train_step")
    assert step.status == "fail", format_report(result)
    assert any(f.name == "train_step_loss_not_divided" and f.code == "loss.backward()" for f in step.findings)
