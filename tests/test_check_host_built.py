"""Parts check builds as the learner's own code builds them, and loops it drives as they are written:
torchtune's layers that take their projections, rotary table and norms as arguments, wired up by a
builder function, and its recipe's train_step(model, optimizer, loss_fn, tokens, labels) that moves
the labels on by one itself (fixtures/learners_torchtune_parts); the Annotated Transformer's layers handed an FFN
written inline as an nn.Sequential by the model's constructor, whose generate(h) is its output layer's
log-softmax, no loop (fixtures/learners_inline_ffn); a GPT-2 port whose forward returns (loss, logits,
presents), a greedy loop with a required use_cache switch, a greedy_search(model, ids, max_new_tokens,
eos_id) and CS336's get_lr_cosine_schedule(t, alpha_max, alpha_min, T_w, T_c)
(fixtures/learners_lm_loops). Each correct file passes with every part checked; a plant fails at its
line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = {  # the folder -> each component's status in its correct.py
    "learners_torchtune_parts": {"MultiHeadAttention": "pass", "FeedForward": "pass", "RMSNorm": "pass",
                                 "TransformerSelfAttentionLayer": "pass", "train_step": "pass"},
    "learners_inline_ffn": {"MultiHeadedAttention": "pass", "EncoderLayer": "pass", "DecoderLayer": "pass",
                            "Seq2Seq": "pass"},
    "learners_lm_loops": {"Attention": "pass", "Block": "pass", "TinyGPT": "pass", "greedy": "pass",
                          "greedy_search": "pass", "get_lr_cosine_schedule": "pass"},
}


@pytest.fixture(scope="module", params=list(EXPECTED))
def correct(request):
    return request.param, check_file(str(FIXTURES / request.param / "correct.py"))


def test_every_part_is_built_and_passes(correct):
    folder, result = correct
    report = format_report(result)
    assert {c.name: c.status for c in result.components} == EXPECTED[folder], report
    assert result.ok, report


PLANTS = {  # (the folder, the kinds checked, the edit, the finding's name, the line quoted)
    "torchtune_mlp_no_residual": ("learners_torchtune_parts", ["block"],
                                  ("        out = h + mlp_out", "        out = mlp_out"),
                                  "no_residual", "line 91: out = mlp_out"),
    "torchtune_rope_exponents": ("learners_torchtune_parts", ["gqa"],
                                 ("torch.arange(0, dim, 2).float() / dim))",
                                  "torch.arange(0, dim, 1)[: dim // 2].float() / dim))"),
                                 "rope_wrong_base", "line 26: inv_freq = 1.0 / (base ** (torch.arange(0, dim, 1)"),
    # torchtune's recipe step, train_step(model, optimizer, loss_fn, tokens, labels): labels moved on here
    "torchtune_clip_after_step": ("learners_torchtune_parts", ["lm_train_step"],
                                  ("    nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n    optimizer.step()\n",
                                   "    optimizer.step()\n    nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n"),
                                  "train_step_clip_after_step", "line 142: nn.utils.clip_grad_norm_"),
    "inline_ffn_no_residual": ("learners_inline_ffn", ["encoder_layer"],
                               ("return self.norm2(x + self.drop(self.feed_forward(x)))",
                                "return self.norm2(self.drop(self.feed_forward(x)))"),
                               "no_residual", "line 49: return self.norm2(self.drop(self.feed_forward(x)))"),
    "cache_mask_from_zero": ("learners_lm_loops", ["gpt"],
                             ("mask = self.bias[:, :, S - T:S, :S]", "mask = self.bias[:, :, :T, :S]"),
                             "departs", "line 28: mask = self.bias[:, :, :T, :S]"),
    "greedy_search_continue": ("learners_lm_loops", ["generate"], ("            break", "            continue"),
                               "greedy_no_stop_at_eos", "line 92: continue"),
    "cosine_from_zero": ("learners_lm_loops", ["schedule"],
                         ("    progress = (t - T_w) / (T_c - T_w)", "    progress = t / T_c"),
                         "cosine_from_step_zero", "line 101: progress = t / T_c"),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_part_fails_at_its_line(tmp_path, plant):
    folder, kinds, edit, name, line = PLANTS[plant]
    result = check_file(edited_copy(tmp_path, FIXTURES / folder / "correct.py", [edit]), only=kinds)
    report = format_report(result)
    failed = [c for c in result.components if c.status == "fail"]
    assert failed and name in [f.name for c in failed for f in c.findings], report
    assert line in report, report
