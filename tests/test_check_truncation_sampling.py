"""Truncation samplers (fixtures/learners_truncation_sampling/, functions in text-generation-webui's
way): epsilon keeps the tokens of probability at least epsilon, eta at least min(epsilon,
sqrt(epsilon) exp(-entropy)), top-a at least top_a times the largest probability squared. The correct
file passes all three; an entropy in bits and a top-a threshold left unsquared fail their filter alone.
Warpers in Hugging Face's way (warpers.py) take the same `epsilon` for epsilon and eta: each is checked
as the filter its class's name says."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_truncation_sampling"
KINDS = ["epsilon_cut", "eta_cut", "top_a"]


def _status(name: str) -> tuple[dict[str, str], str, list[tuple[str, int]]]:
    result = check_file(str(HERE / name), only=KINDS)
    found = [(f.name, f.line) for c in result.components for f in c.findings]
    return {c.kind: c.status for c in result.components}, format_report(result), found


def _line(name: str, text: str) -> int:
    return next(n for n, line in enumerate((HERE / name).read_text().splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def statuses():
    names = ("correct.py", "eta_entropy_in_bits.py", "top_a_not_squared.py", "warpers.py", "warpers_eta_max.py")
    return {name: _status(name) for name in names}


def test_the_three_filters_pass(statuses):
    status, report, _ = statuses["correct.py"]
    assert status == dict.fromkeys(KINDS, "pass"), report


@pytest.mark.parametrize("name, failing", [("eta_entropy_in_bits.py", "eta_cut"), ("top_a_not_squared.py", "top_a")])
def test_a_planted_threshold_fails_its_filter_alone(statuses, name, failing):
    status, report, _ = statuses[name]
    assert status == {k: "fail" if k == failing else "pass" for k in KINDS}, report


def test_an_entropy_in_bits_is_quoted_where_it_is_computed(statuses):
    _, report, found = statuses["eta_entropy_in_bits.py"]
    assert found == [("departs", _line("eta_entropy_in_bits.py", "math.log(2)"))], report


def test_warpers_sharing_a_setting_are_told_apart_by_their_names(statuses):
    status, report, _ = statuses["warpers.py"]
    assert status == {"epsilon_cut": "pass", "eta_cut": "pass"}, report
    status, report, found = statuses["warpers_eta_max.py"]
    assert status == {"epsilon_cut": "pass", "eta_cut": "fail"}, report
    assert found == [("departs", _line("warpers_eta_max.py", "eta = torch.max("))], report
