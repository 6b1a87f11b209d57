"""`handformer check` on a Qwen3-MoE written after the Hugging Face port. Every class carries the
family's prefix (Qwen3MoeRMSNorm, Qwen3MoeAttention, Qwen3MoeMLP, Qwen3MoeDecoderLayer): MoE in a name
keeps a class from being found by its ending only where the class holds experts itself. The model,
grouped-query attention in blocks whose experts are as wide as d_model, is mapped and compared, its
loss the cross-entropy of labels it shifts itself plus the router's balancing term. A norm that sums
the squares and an MLP that turns the wrong branch each fail at their line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_qwen3_moe"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module")
def summed():
    return check_file(str(HERE / "rmsnorm_sum.py"), only=["rmsnorm", "gpt"])


@pytest.fixture(scope="module")
def wrong_branch():
    return check_file(str(HERE / "silu_on_up.py"), only=["ffn"])


def test_every_prefixed_component_is_found_checked_and_passes(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"Qwen3MoeAttention": "pass", "Qwen3MoeMLP": "pass", "Qwen3MoeRMSNorm": "pass",
                      "Qwen3MoeDecoderLayer": "pass", "Qwen3MoeForCausalLM": "pass"}, format_report(correct)


def test_the_model_loss_adds_the_balancing_term_to_shifted_labels(correct):
    model = next(c for c in correct.components if c.name == "Qwen3MoeForCausalLM")
    notes = " ".join(n["en"] for n in model.notes)
    assert "load-balancing loss" in notes and "shifts the labels itself" in notes, notes


def test_a_norm_summing_squares_fails_norm_and_model_at_its_line(summed):
    for comp in summed.components:
        assert comp.status == "fail", format_report(summed)
        assert ("rmsnorm_sum_squares", "variance = x.pow(2).sum(-1, keepdim=True)") in [
            (f.name, f.code) for f in comp.findings]


def test_an_mlp_turning_the_up_branch_fails_at_its_line(wrong_branch):
    (mlp,) = wrong_branch.components
    assert mlp.status == "fail", format_report(wrong_branch)
    assert [(f.name, f.code) for f in mlp.findings] == [
        ("gated_activation_wrong_branch", "return self.down_proj(self.gate_proj(x) * F.silu(self.up_proj(x)))")]
