"""A reward model's pairwise loss is read as its own kind (reward_pair.py): handed a stand-in reward
model, it must equal -log sigmoid(r_chosen - r_rejected), in two forms (tests/fixtures/learners_reward/:
a log-sigmoid of the margin; a softplus of the reversed margin that hands back the rewards), and the
rewards subtracted the wrong way round FAIL at the line that takes the (log-)sigmoid. A step that
trains on pairs is read as a reward model's step (the pair as a batch, or by name; clipped at its
max_grad_norm): its parameters after one SGD step on a stand-in reward model equal the reference's,
and a gradient clipped after optimizer.step() is named. A model that gives one score a sequence is no
language model: NOT CHECKED with that reason, never FAIL."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_results import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_reward" / "correct.py"
SWAPPED = [("-F.logsigmoid(r_chosen - r_rejected)", "-F.logsigmoid(r_rejected - r_chosen)"),
           ("F.softplus(rewards_rejected - rewards_chosen)", "F.softplus(rewards_chosen - rewards_rejected)")]
CLIP_AFTER = [("    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)\n    opt.step()",
               "    opt.step()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)")]


@pytest.fixture(scope="module")
def correct():
    return {c.name: c for c in check_file(str(CORRECT)).components}


def test_both_forms_of_the_pairwise_loss_pass(correct):
    assert correct["reward_loss"].status == "pass" and correct["pairwise_loss"].status == "pass"


def test_a_scoring_model_is_not_checked_with_the_reason(correct):
    model = correct["TinyRewardModel"]
    assert model.status == "not_checked" and "one score a sequence" in model.error.message


def test_two_forms_of_a_pairwise_step_pass_clipped_or_not(correct):
    assert correct["train_step"].status == "pass" and correct["train_batch"].status == "pass"
    assert "clipped at norm 1.0" in correct["train_batch"].checks[0].name["en"]


def test_rewards_subtracted_the_wrong_way_round_fail_at_their_line(tmp_path):
    result = planted_copy(CORRECT, tmp_path, "swapped", *SWAPPED)
    found = {c.name: c for c in result.components}
    for name, (_, plant) in zip(("reward_loss", "pairwise_loss"), SWAPPED):
        assert found[name].status == "fail", format_report(result)
        assert any(plant in (f.code or "") for f in found[name].findings), format_report(result)


def test_a_gradient_clipped_after_the_step_is_named_at_its_line(tmp_path):
    result = planted_copy(CORRECT, tmp_path, "clip_after", *CLIP_AFTER)
    step = {c.name: c for c in result.components}["train_batch"]
    assert [f.name for f in step.findings] == ["train_step_clip_after_step"], format_report(result)
    assert "clip_grad_norm_" in (step.findings[0].code or ""), format_report(result)
