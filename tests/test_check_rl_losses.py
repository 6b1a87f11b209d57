"""GRPO's pieces (tests/fixtures/learners_rl_losses/): policy losses that take one advantage a
sequence, and group-normalised advantages. A loss that
spreads it over the tokens itself (`advantages.unsqueeze(-1)`, `advantages[:, None]`) raises on
advantages a token and is compared on one a sequence; a loss with two clipping ranges (DAPO's
clip-higher, `clip_ratio_low`, `clip_ratio_high`) is handed two different ones, so that an upper bound
written with the lower range shows. `compute_advantages(rewards, group_size)` and `grpo_advantages(rewards,
num_generations)` are GRPO's advantages, not GAE: each reward less its group's mean, over its deviation.
Each correct function passes; each plant fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

FOLDER = Path(__file__).parent / "fixtures" / "learners_rl_losses"
HIGHER, GRPO = FOLDER / "clip_higher.py", FOLDER / "grpo_sequence.py"
VIEW, REPEAT = FOLDER / "group_view.py", FOLDER / "group_repeat.py"  # GRPO's advantages, two ways
CORRECT = {"higher": HIGHER, "grpo": GRPO, "view": VIEW, "repeat": REPEAT}
# name: (file, edit, the quoted line's start)
PLANTS = {
    "higher_bound_low": (HIGHER, ("1 + clip_ratio_high)", "1 + clip_ratio_low)"), "clipped = -adv * torch.clamp"),
    "grpo_max": (GRPO, ("-torch.min(", "-torch.max("), "token_loss = -torch.max("),
    "view_not_normalised": (VIEW, ("((grouped - mean) / (std + eps)).view(-1)", "(grouped - mean).view(-1)"),
                            "return (grouped - mean)"),
    "repeat_not_centred": (REPEAT, ("(rewards - mean_grouped) / ", "rewards / "), "return rewards / "),
}
# name: (its kind, what its check or a note says)
SAID = {"higher": ("ppo_policy_loss", "eps low=0.2, high=0.3"), "grpo": ("ppo_policy_loss", "eps=0.2"),
        "view": ("group_advantages", "the deviation unbiased, eps 1e-06"),
        "repeat": ("group_advantages", "the deviation unbiased, eps 0.0001")}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rl_losses")
    out = {name: check_file(str(path)) for name, path in CORRECT.items()}
    for name, (path, edit, _) in PLANTS.items():
        out[name] = check_file(planted_copy(folder, name, path, edit))
    return out


@pytest.mark.parametrize("name", list(CORRECT))
def test_the_correct_function_is_checked_as_its_kind_and_passes(results, name):
    result = results[name]
    (loss,) = result.components
    kind, said = SAID[name]
    assert exit_code(result) == 0 and loss.status == "pass" and loss.kind == kind, format_report(result)
    assert any(said in t["en"] for t in [loss.checks[0].name, *loss.notes]), format_report(result)
    per_sequence = any("one advantage a sequence" in n["en"] for n in loss.notes)
    assert per_sequence == (kind == "ppo_policy_loss"), loss.notes


@pytest.mark.parametrize("name", list(PLANTS))
def test_the_plant_fails_at_its_line(results, name):
    result = results[name]
    assert exit_code(result) == 1, format_report(result)
    findings = [f for c in result.components for f in c.findings]
    assert any(f.code and f.code.strip().startswith(PLANTS[name][2]) for f in findings), format_report(result)


STEPS = {"GRPO": FOLDER / "grpo_step.py", "REINFORCE": FOLDER / "reinforce_step.py"}


@pytest.mark.parametrize("objective", list(STEPS))
def test_a_reinforcement_learning_step_is_not_checked_naming_its_objective(objective):
    result = check_file(str(STEPS[objective]))
    (step,) = result.components
    assert step.status == "not_checked", format_report(result)
    assert f"a reinforcement-learning step ({objective})" in step.error.message, format_report(result)
