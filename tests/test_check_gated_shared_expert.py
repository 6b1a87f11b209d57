"""A mixture of experts whose shared expert is scaled by a sigmoid gate of its own, Linear(D, 1)
(Qwen2-MoE's shared_expert_gate), in two styles: tests/fixtures/learners_gated_shared_expert/ (the
mixture in a file of its own, a small model importing it) and tests/fixtures/learners_qwen2_moe/
(Hugging Face's Qwen2MoeSparseMoeBlock in one file). The mixture alone, its block and its model are
compared with the gate read in; the gate planted without its sigmoid fails the block and the model.
One check run per file."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = Path(__file__).parent / "fixtures" / "learners_gated_shared_expert"


@pytest.fixture(scope="module")
def runs():
    return {name: check_file(str(FOLDER / f"{name}.py")) for name in ("correct", "no_sigmoid", "model",
                                                                       "model_no_sigmoid")}


def _by_name(report):
    return {c.name: c for c in report.components}


def test_the_mixture_with_its_gated_shared_expert_passes(runs):
    moe = _by_name(runs["correct"])["MoE"]
    assert moe.status == "pass" and any("1 shared expert" in n["en"] for n in moe.notes), (
        format_report(runs["correct"]))


def test_the_shared_expert_scaled_by_the_raw_gate_fails(runs):
    assert _by_name(runs["no_sigmoid"])["MoE"].status == "fail", format_report(runs["no_sigmoid"])


def test_its_block_and_model_pass_with_the_gate_read_in(runs):
    found = _by_name(runs["model"])
    assert {n: c.status for n, c in found.items()} == {"Attention": "pass", "Block": "pass", "MoELM": "pass"}, (
        format_report(runs["model"]))
    assert "moe.shared_gate -> shared expert's gate" in format_report(runs["model"])
    assert any("scaled by the sigmoid of its own gate" in n["en"] for n in found["Block"].notes)


def test_its_gate_without_the_sigmoid_fails_the_block_and_the_model(runs):
    found = _by_name(runs["model_no_sigmoid"])
    assert (found["Block"].status, found["MoELM"].status) == ("fail", "fail"), (
        format_report(runs["model_no_sigmoid"]))


@pytest.fixture(scope="module")
def qwen2():
    return check_file(str(FOLDER.parent / "learners_qwen2_moe" / "correct.py"), only=["block", "gpt"])


def test_qwen2_moe_sparse_block_and_model_pass(qwen2):
    assert {c.name: c.status for c in qwen2.components} == {
        "Qwen2MoeDecoderLayer": "pass", "Qwen2MoeForCausalLM": "pass"}, format_report(qwen2)
    assert "mlp.shared_expert_gate -> shared expert's gate" in format_report(qwen2)
