"""`handformer check` on a model whose forward takes more than the tokens, each argument made by check in
the form the code reads: a time-major (T, B) model that requires its caller's causal mask (an additive
float mask, -inf above the diagonal), and a model that requires a padding mask (1 = a real token) and
its positions as one row a sequence (B, T). Each is graded against the reference, its causality checked,
and a planted mistake fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY = Path(__file__).parent / "fixtures" / "learners_model_arguments"
CAUSAL = "causality: changing token 5 leaves logits 0..4 unchanged"


@pytest.fixture(scope="module", params=[("time_major", "TinyLM"), ("position_rows", "PaddedLM")])
def correct(request):
    file, model = request.param
    return check_file(str(FAMILY / f"{file}.py"), only=["gpt"])


@pytest.fixture(scope="module", params=[
    ("time_major_scale_divided", "TinyLM", "departs", 42, "x = self.tok(src) / math.sqrt(self.d_model)"),
    # the padding mask or-ed with the causal one: with no padding, every key is seen
    ("position_rows_mask_or", "PaddedLM", "causal_mask_missing", 47, "+ mask, dim=-1)")])
def planted(request):
    file, model, name, line, code = request.param
    return check_file(str(FAMILY / f"{file}.py"), only=["gpt"]), name, line, code


def test_a_model_that_takes_more_than_tokens_is_driven_and_passes(correct):
    assert [c.status for c in correct.components] == ["pass"], format_report(correct)
    model = correct.components[0]
    assert [c.ok for c in model.checks if c.name["en"] == CAUSAL] == [True]


def test_a_planted_model_that_takes_more_than_tokens_fails_at_its_line(planted):
    result, name, line, code = planted
    model = result.components[0]
    assert [c.status for c in result.components] == ["fail"], format_report(result)
    assert (model.findings[0].name, model.findings[0].line) == (name, line)
    assert code in model.findings[0].code
