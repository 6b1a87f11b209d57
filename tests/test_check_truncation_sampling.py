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


def _status(name: str) -> tuple[dict[str, str], str]:
    result = check_file(str(HERE / name), only=KINDS)
    return {c.kind: c.status for c in result.components}, format_report(result)


@pytest.fixture(scope="module")
def statuses():
    names = ("correct.py", "eta_entropy_in_bits.py", "top_a_not_squared.py", "warpers.py", "warpers_eta_max.py")
    return {name: _status(name) for name in names}


def test_the_three_filters_pass(statuses):
    status, report = statuses["correct.py"]
    assert status == dict.fromkeys(KINDS, "pass"), report


@pytest.mark.parametrize("name, failing", [("eta_entropy_in_bits.py", "eta_cut"), ("top_a_not_squared.py", "top_a")])
def test_a_planted_threshold_fails_its_filter_alone(statuses, name, failing):
    status, report = statuses[name]
    assert status == {k: "fail" if k == failing else "pass" for k in KINDS}, report


def test_warpers_sharing_a_setting_are_told_apart_by_their_names(statuses):
    status, report = statuses["warpers.py"]
    assert status == {"epsilon_cut": "pass", "eta_cut": "pass"}, report
    status, report = statuses["warpers_eta_max.py"]
    assert status == {"epsilon_cut": "pass", "eta_cut": "fail"}, report
