"""A log-probability helper that returns several tensors is read by the element of a form the
sequence_logps kind knows (fixtures/learners_logps_tuple): SimPO's (mean [N], per-token [N, T-1],
mask [N, T-1]) by its mean, a dict of per-token log-probabilities and their mask by their masked sum; one
whose first argument is the model it calls is handed a stand-in model that returns check's logits;
a plant in either fails at its line, and a helper that returns no such form (the logits and labels
lined up) is NOT CHECKED with the shapes it returned, never an internal error."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FIXTURES = Path(__file__).parent / "fixtures" / "learners_logps_tuple"
EXPECTED = {  # file -> (status, the line a finding quotes, or None)
    "simpo_avg.py": ("pass", None),
    "simpo_avg_p_no_shift.py": ("fail", 11),
    "dict_tokens.py": ("pass", None),
    "dict_tokens_p_logits_shifted.py": ("fail", 10),
    "aligned_only.py": ("not_checked", None),
    "model_first.py": ("pass", None),  # get_logps(model, input_ids, loss_mask): handed a stand-in model
    "model_first_p_own_token.py": ("fail", 9),
}


@pytest.fixture(scope="module", params=list(EXPECTED))
def run(request):
    return request.param, check_file(str(FIXTURES / request.param), only=["sequence_logps"])


def test_read_by_form(run):
    name, result = run
    report = format_report(result)
    (comp,) = result.components
    status, line = EXPECTED[name]
    assert comp.status == status, report
    assert comp.error is None or comp.error.kind != "internal", report
    if line is not None:
        assert line in {f.line for f in comp.findings}, report


def test_unread_says_what_came_back(run):
    name, result = run
    if name == "aligned_only.py":
        (comp,) = result.components
        assert "((3, 6, 11), (3, 6))" in comp.error.message and "found neither" in comp.error.message
        assert comp.adapter


def test_the_check_line_says_what_was_compared(run):
    """A helper that returns each row's mean is compared with the mean, and its check line says so."""
    name, result = run
    said = {"simpo_avg.py": ("averaged over its labels", "的平均值"), "dict_tokens.py": ("summed", "之和")}
    if name in said:
        (comp,) = result.components
        en, zh = said[name]
        (line,) = [c.name for c in comp.checks if "token_logprobs" in c.name["en"]]
        assert line["en"].endswith(f"token_logprobs {en}") and f"token_logprobs {zh}一致" in line["zh"], line
