"""`handformer check` on three learners' files in styles whose models or functions it did not find or
could not drive: PPO for a language model (CleanRL's time-first GAE loop and clipped surrogate, the
policy on torch's own encoder stack made causal), a word-level LM whose forward requires Hugging
Face's attention_mask, and a DistilBERT-like sentence encoder whose positions must reach its output.
Each correct file passes whole; each planted mistake fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
PPO = FIXTURES / "learners_ppo_lm" / "correct.py"
PADDED = FIXTURES / "learners_padded_lm" / "correct.py"
ENCODER = FIXTURES / "learners_sentence_encoder" / "correct.py"

# OpenRLHF's form: batch first, the advantages appended and stacked, the loss through a masked mean
OPENRLHF = '''import torch


def masked_mean(x, mask, dim=None):
    return (x * mask).sum(dim) / mask.sum(dim) if dim is not None else (x * mask).sum() / mask.sum()


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    lastgaelam = 0
    advantages_reversed = []
    response_length = rewards.size(1)
    values = action_mask * values
    rewards = action_mask * rewards
    for t in reversed(range(response_length)):
        nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lambd * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages.detach(), returns


def policy_loss(log_probs, old_log_probs, advantages, action_mask=None, clip_eps=0.2):
    ratio = (log_probs - old_log_probs).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages
    loss = masked_mean(-torch.min(surr1, surr2), action_mask, dim=-1).mean()
    return loss
'''


def _statuses(result):
    return {c.name: c.status for c in result.components}


def _findings(result, name):
    return [(f.name, f.line, f.code) for c in result.components if c.name == name for f in c.findings]


@pytest.fixture(scope="module")
def ppo():
    return check_file(str(PPO))


def test_the_ppo_file_passes_whole(ppo):
    assert _statuses(ppo) == {"PolicyNet": "pass", "compute_advantages": "pass",
                              "clipped_surrogate_loss": "pass"}, format_report(ppo)


def test_a_time_first_gae_is_compared_so(ppo):
    gae = next(c for c in ppo.components if c.name == "compute_advantages")
    assert any("(T, B)" in n["en"] for n in gae.notes), format_report(ppo)


def test_gae_bootstrapping_from_its_own_step_fails_at_the_td_error(tmp_path):
    path = edited_copy(tmp_path, PPO, [("nextvalues = values[t + 1]", "nextvalues = values[t]")])
    result = check_file(path, only=["gae"])
    assert _statuses(result) == {"compute_advantages": "fail"}, format_report(result)
    assert _findings(result, "compute_advantages")[0][2] == "delta = rewards[t] + gamma * nextvalues - values[t]"


def test_the_optimistic_bound_fails_the_policy_loss_at_its_line(tmp_path):
    path = edited_copy(tmp_path, PPO, [("torch.max(pg_loss1, pg_loss2)", "torch.min(pg_loss1, pg_loss2)")])
    result = check_file(path, only=["ppo_policy_loss"])
    assert _findings(result, "clipped_surrogate_loss") == [
        ("departs", 49, "return torch.min(pg_loss1, pg_loss2).mean()")], format_report(result)


def test_a_policy_on_torch_encoder_layers_without_its_causal_mask_fails(tmp_path):
    path = edited_copy(tmp_path, PPO, [("h = self.trunk(h, mask=mask, is_causal=True)", "h = self.trunk(h)")])
    result = check_file(path, only=["gpt"])
    assert [f[0] for f in _findings(result, "PolicyNet")] == ["causal_mask_missing"], format_report(result)


def test_openrlhf_forms_pass_and_a_wrong_operand_handed_to_a_helper_is_quoted_where_it_is_made(tmp_path):
    (tmp_path / "ok").mkdir()
    ok = tmp_path / "ok" / "rlhf.py"
    ok.write_text(OPENRLHF, encoding="utf-8")
    assert _statuses(check_file(str(ok))) == {"get_advantages_and_returns": "pass", "policy_loss": "pass"}
    wrong = edited_copy(tmp_path, ok, [("-torch.min(surr1, surr2)", "-torch.max(surr1, surr2)"),
                                       ("lastgaelam = delta + gamma * lambd", "lastgaelam = delta + lambd")])
    result = check_file(wrong)
    assert _statuses(result) == {"get_advantages_and_returns": "fail", "policy_loss": "fail"}
    assert _findings(result, "policy_loss")[0][1:] == (
        28, "loss = masked_mean(-torch.max(surr1, surr2), action_mask, dim=-1).mean()"), format_report(result)
    assert _findings(result, "get_advantages_and_returns")[0][1] == 17


@pytest.fixture(scope="module")
def padded():
    return check_file(str(PADDED))


def test_a_model_that_requires_attention_mask_is_driven_with_one_of_ones(padded):
    assert _statuses(padded) == {"Layer": "pass", "ChatLM": "pass"}, format_report(padded)


@pytest.mark.parametrize("edit, name, line", [
    ((".triu(1)  # True", ".triu(2)  # True"), "causal_off_by_one", 38),
    (("labels[:, 1:].reshape(-1)", "labels[:, :-1].reshape(-1)"), "train_step_no_shift", 61)])
def test_its_planted_mistakes_fail_at_their_lines(tmp_path, edit, name, line):
    result = check_file(edited_copy(tmp_path, PADDED, [edit]), only=["gpt"])
    assert [f[:2] for f in _findings(result, "ChatLM")] == [(name, line)], format_report(result)


def test_an_encoder_whose_positions_never_reach_it_is_pe_missing_at_the_sum(tmp_path):
    assert _statuses(check_file(str(ENCODER))) == {"EncoderOnlyModel": "pass"}
    result = check_file(edited_copy(tmp_path, ENCODER, [("x = word_emb + pos_emb", "x = word_emb")]))
    assert _findings(result, "EncoderOnlyModel") == [("pe_missing", 19, "x = word_emb")], format_report(result)


ZERO_GAIN = '''import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.zeros(dim))  # stored as scale - 1

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * self.scale
'''


def test_a_gain_built_at_zero_and_applied_as_it_is_is_quoted_at_its_line(tmp_path):
    path = tmp_path / "norm.py"
    path.write_text(ZERO_GAIN, encoding="utf-8")
    (norm,) = check_file(str(path), only=["rmsnorm"]).components
    assert norm.status == "fail" and [(f.line, f.code) for f in norm.findings] == [(13, "return x * self.scale")]


# Hugging Face Mistral's way: a window mask that sees window + 1 keys, True = may attend, handed back
# beside the causal one
WINDOWED = '''import torch


def build_attention_masks(seq_len, window):
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    too_far = torch.ones(seq_len, seq_len, dtype=torch.bool).tril(diagonal=-window - 1)
    return causal, causal & ~too_far
'''


@pytest.mark.parametrize("edit, status", [(None, "pass"), (("causal & ~too_far", "~too_far"), "fail")])
def test_a_mask_function_handed_a_window_gives_the_causal_mask_and_a_window(tmp_path, edit, status):
    path = tmp_path / "masks.py"
    path.write_text(WINDOWED if edit is None else WINDOWED.replace(*edit), encoding="utf-8")
    (masks,) = check_file(str(path)).components
    assert (masks.kind, masks.status) == ("causal_mask", status), format_report(check_file(str(path)))


def test_a_policy_loss_of_one_advantage_a_sequence_is_compared_so(tmp_path):
    """GRPO's: the advantages (B,) spread over each sequence's tokens."""
    path = tmp_path / "grpo.py"
    path.write_text("import torch\n\n\ndef clipped_policy_loss(logp, old_logp, advantages, eps=0.2):\n"
                    "    ratio = torch.exp(logp - old_logp)\n    a = advantages.unsqueeze(1)\n"
                    "    return -torch.min(ratio * a, ratio.clamp(1 - eps, 1 + eps) * a).mean()\n", encoding="utf-8")
    (loss,) = check_file(str(path)).components
    assert loss.status == "pass" and any("(B,)" in n["en"] for n in loss.notes), loss.notes
