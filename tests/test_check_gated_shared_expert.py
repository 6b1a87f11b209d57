"""A mixture of experts whose shared expert is scaled by a sigmoid gate of its own, Linear(D, 1)
(Qwen2-MoE's shared_expert_gate; tests/fixtures/learners_gated_shared_expert/): the mixture alone is
compared with the gate read in; in a block or a model, whose reading of a mixture has no such gate,
it is NOT CHECKED and the reason names the part left out, never FAIL. One check run per file."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = Path(__file__).parent / "fixtures" / "learners_gated_shared_expert"


@pytest.fixture(scope="module")
def runs():
    return {name: check_file(str(FOLDER / f"{name}.py")) for name in ("correct", "no_sigmoid", "model")}


def _by_name(report):
    return {c.name: c for c in report.components}


def test_the_mixture_with_its_gated_shared_expert_passes(runs):
    moe = _by_name(runs["correct"])["MoE"]
    assert moe.status == "pass" and any("1 shared expert" in n["en"] for n in moe.notes), (
        format_report(runs["correct"]))


def test_the_shared_expert_scaled_by_the_raw_gate_fails(runs):
    assert _by_name(runs["no_sigmoid"])["MoE"].status == "fail", format_report(runs["no_sigmoid"])


def test_its_block_and_model_are_not_checked_and_name_the_gate(runs):
    found = _by_name(runs["model"])
    for name in ("Block", "MoELM"):
        assert found[name].status == "not_checked", format_report(runs["model"])
        assert "(shared_gate)" in found[name].error.message, format_report(runs["model"])
    assert found["Attention"].status == "pass", format_report(runs["model"])
