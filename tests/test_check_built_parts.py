"""Parts check builds and drives from what their code reads, where their signatures name nothing check
knows: timm's Mlp(in_features, hidden_features, out_features) with every width required
(fixtures/learners_timm_vit), GPT-2's MLP(n_state, config) whose model width comes from the config
(fixtures/learners_gpt2_conv1d), a Llama attention and block that take a required use_cache switch
(fixtures/learners_llama_switch), a block named MoEBlock that is attention then a mixture of
experts (fixtures/learners_moe_block), and a classifier's training step, train_step(model, images,
labels, optimizer) (fixtures/learners_timm_vit), and OLMo's LayerNorm(config, size=None), whose optional
size overrides the config's width (fixtures/learners_olmo_norm). Each correct file passes with every part checked; a plant in
the part fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = {  # the folder -> each component's status in its correct.py
    "learners_timm_vit": {"Attention": "pass", "Mlp": "pass", "Block": "differs", "train_step": "pass"},
    "learners_gpt2_conv1d": {"Attention": "pass", "MLP": "pass", "Block": "pass", "GPT2LMHeadModel": "pass"},
    "learners_llama_switch": {"Attention": "pass", "repeat_kv": "pass", "apply_rotary_emb": "pass",
                              "precompute_freqs_cis": "pass", "FeedForward": "pass", "RMSNorm": "pass",
                              "TransformerBlock": "pass"},
    "learners_moe_block": {"CausalAttention": "pass", "SparseMoE": "pass", "RMSNorm": "pass", "MoEBlock": "pass"},
    "learners_olmo_norm": {"LayerNorm": "pass"},
}


@pytest.fixture(scope="module", params=list(EXPECTED))
def correct(request):
    return request.param, check_file(str(FIXTURES / request.param / "correct.py"))


def test_every_part_is_built_and_passes(correct):
    folder, result = correct
    report = format_report(result)
    assert {c.name: c.status for c in result.components} == EXPECTED[folder], report
    assert result.ok, report


PLANTS = {  # (the folder, the kind checked, the edit, the finding's name, the line quoted)
    "timm_mlp_dropout": ("learners_timm_vit", "ffn", ("x = self.drop(self.act(self.fc1(x)))",
                                                      "x = F.dropout(self.act(self.fc1(x)), 0.5)"),
                         "dropout_in_eval", "line 50: x = F.dropout(self.act(self.fc1(x)), 0.5)"),
    # a classifier's step, train_step(model, images, labels, optimizer): model(images) -> (B, C) logits
    "timm_step_no_zero_grad": ("learners_timm_vit", "train_step", ("    optimizer.zero_grad()\n", ""),
                               "train_step_no_zero_grad", "line 92: loss.backward()"),
    "gpt2_mlp_relu": ("learners_gpt2_conv1d", "ffn", ("h = gelu_new(self.c_fc(x))", "h = F.relu(self.c_fc(x))"),
                      "ffn_wrong_activation", "line 79: h = F.relu(self.c_fc(x))"),
    "llama_switch_no_scaling": ("learners_llama_switch", "gqa",
                                ("scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim)",
                                 "scores = q @ k.transpose(2, 3)"),
                                "no_scaling", "line 86: scores = q @ k.transpose(2, 3)"),
    "moe_block_no_residual": ("learners_moe_block", "block", ("x = x + self.attn(self.attn_norm(x))",
                                                              "x = self.attn(self.attn_norm(x))"),
                              "no_residual", "line 95: x = self.attn(self.attn_norm(x))"),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_part_fails_at_its_line(tmp_path, plant):
    folder, kind, edit, name, line = PLANTS[plant]
    result = check_file(edited_copy(tmp_path, FIXTURES / folder / "correct.py", [edit]), only=[kind])
    report = format_report(result)
    failed = [c for c in result.components if c.status == "fail"]
    assert failed and name in [f.name for c in failed for f in c.findings], report
    assert line in report, report
