"""Correct code that `handformer check` once failed for what it had guessed, each in a style of its own,
with a plant in each that must still fail:

- a Mistral-style attention whose KV cache is a tensor of its own, written in place without gradients:
  its gradients compared with handformer's keys and values held constant (a plant that detaches the
  queries too still fails);
- a rotary GPT whose `generate` never crops (no learned position table: the model is built long
  enough) and a greedy search whose max_length counts the prompt (read so by what it returns; one
  that runs a token too far still fails);
- a reward model on a Llama-style backbone: its attention requires a keys-only padding mask and builds
  its causal mask inside; its scores and its preference step are NOT CHECKED, the scores checked for
  right padding (a plant that reads the padded end fails).
"""

from __future__ import annotations

import pytest
from check_results import FIXTURES, component, notes, planted_copy, statuses

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

HELD = "gradients compared with handformer's with its keys and values held constant"


@pytest.fixture(scope="module")
def mistral():
    return check_file(str(FIXTURES / "learners_mistral_cache" / "correct.py"))


def test_a_cache_kept_without_gradients_passes(mistral):
    assert set(statuses(mistral).values()) == {"pass"}, format_report(mistral)
    assert HELD in notes(mistral, "Attention") and HELD in notes(mistral, "TransformerBlock")


def test_queries_detached_too_still_fail(tmp_path):
    planted = planted_copy(FIXTURES / "learners_mistral_cache" / "correct.py", tmp_path, "p1",
                           ("q, k = rotate(q, cos, sin), rotate(k, cos, sin)",
                            "q, k = rotate(q, cos, sin).detach(), rotate(k, cos, sin)"))
    assert statuses(planted)["Attention"] == "fail", format_report(planted)


@pytest.fixture(scope="module")
def gptj():
    return check_file(str(FIXTURES / "learners_gptj_rotary" / "correct.py"))


def test_a_rotary_model_needs_no_crop_and_max_length_counts_the_prompt(gptj):
    assert set(statuses(gptj).values()) == {"pass"}, format_report(gptj)
    assert "no crop is needed" in component(gptj, "GPTJForCausalLM.generate").driven["en"]
    assert "its max_length counts the prompt too" in notes(gptj, "greedy_search")


def test_a_greedy_search_one_token_too_far_fails(tmp_path):
    planted = planted_copy(FIXTURES / "learners_gptj_rotary" / "correct.py", tmp_path, "p1",
                           ("while input_ids.shape[1] < max_length:", "while input_ids.shape[1] <= max_length:"))
    assert statuses(planted)["greedy_search"] == "fail", format_report(planted)


@pytest.fixture(scope="module")
def reward():
    return check_file(str(FIXTURES / "learners_reward_llama" / "correct.py"))


def test_a_reward_model_is_not_failed(reward):
    assert statuses(reward) == {"Attention": "pass", "apply_rotary": "pass", "SwiGLU": "pass", "RMSNorm": "pass",
                                "DecoderLayer": "pass", "LlamaRewardModel": "not_checked",
                                "preference_step": "not_checked"}, format_report(reward)
    assert "a preference objective" in component(reward, "preference_step").error.message
    assert "causal" in notes(reward, "Attention") and "padding mask of its keys" in notes(reward, "DecoderLayer")


def test_a_reward_read_at_the_padded_end_fails(tmp_path):
    planted = planted_copy(FIXTURES / "learners_reward_llama" / "correct.py", tmp_path, "p1",
                           ("last = attention_mask.sum(dim=1) - 1",
                            "last = torch.full_like(attention_mask.sum(dim=1), attention_mask.size(1) - 1)"))
    assert statuses(planted)["LlamaRewardModel"] == "fail", format_report(planted)
