"""Correct files in three Hugging Face family styles that `handformer check` once failed, and a plant
in two of them that must still fail:

- Baichuan's: the model builds ALiBi (each head's slope times the distance j - i, with the causal
  mask) and hands it to every layer as its additive mask (H, T, S); the attention puts a batch axis in
  front (`attention_mask.unsqueeze(0)`), so it reads one (T, S) mask for the whole batch, which check
  finds by what it does; a comment there speaks of ALiBi, its code adds none; the model is compared
  with handformer's CausalLM with ALiBi;
- StableLM's: partial rotary, a config whose key/value heads equal its heads and an attention that
  never repeats them (it raises with fewer: checked with as many, noted); a forward that returns its
  cache with no use_cache argument, that cache checked; a `generate` that unpacks
  `logits, past_key_values = self(ids, past_key_values=cache)`, driven by the stand-in where the
  model fails, which hands back a cache from the first call;
- InternLM2's: a block whose attention packs wqkv by key/value group ([q.. | k | v] a group) and
  requires its additive mask, the layout read on one token with every key visible; a training step in
  Hugging Face's form, train_step(model, batch, optimizer, scheduler) with batch {"input_ids",
  "labels"} (the labels are the ids, shifted in the step), checked as a language model's step, and
  the labels not shifted named at the line that cuts them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
BAICHUAN = FIXTURES / "learners_baichuan" / "correct.py"
STABLELM = FIXTURES / "learners_stablelm" / "correct.py"
INTERNLM = FIXTURES / "learners_internlm" / "correct.py"
NORMED_RESIDUAL = "        h = self.post_attention_layernorm(x)\n        x = h + self.mlp(h)\n"


def statuses(result):
    return {c.name: c.status for c in result.components}


def component(result, name):
    return next(c for c in result.components if c.name == name)


@pytest.fixture(scope="module")
def baichuan():
    return check_file(str(BAICHUAN))


@pytest.fixture(scope="module")
def baichuan_flipped(tmp_path_factory):
    """ALiBi's distance i - j: the bias rewards the distant past."""
    return check_file(edited_copy(tmp_path_factory.mktemp("flipped"), BAICHUAN, [(
        "distance = pos[None, :] - pos[:, None]", "distance = pos[:, None] - pos[None, :]")]))


@pytest.fixture(scope="module")
def stablelm():
    return check_file(str(STABLELM))


@pytest.fixture(scope="module")
def stablelm_normed(tmp_path_factory):
    """The FFN's residual taken from the normed stream."""
    return check_file(edited_copy(tmp_path_factory.mktemp("normed"), STABLELM, [(
        "        x = x + self.mlp(self.post_attention_layernorm(x))\n", NORMED_RESIDUAL)]))


def test_alibi_handed_in_a_mask_shared_by_the_batch_passes(baichuan):
    assert set(statuses(baichuan).values()) == {"pass"}, format_report(baichuan)
    attention = component(baichuan, "PackedAttention")
    assert "(T, S), one mask for the whole batch" in attention.convention["en"]
    assert not any("ALiBi" in n["en"] for n in attention.notes)  # its comment adds no term
    assert "ALiBi" in component(baichuan, "TinyBaichuan").convention["en"]


def test_alibi_of_the_wrong_sign_fails_in_the_model(baichuan_flipped):
    assert statuses(baichuan_flipped)["TinyBaichuan"] == "fail", format_report(baichuan_flipped)


def test_ungrouped_attention_in_an_ungrouped_file_passes_noted(stablelm):
    assert set(statuses(stablelm).values()) == {"pass"}, format_report(stablelm)
    assert any("does not repeat them" in n["en"] for n in component(stablelm, "Attention").notes)


def test_the_cache_a_forward_returns_without_use_cache_is_checked(stablelm):
    checks = {c.name["en"]: c.ok for c in component(stablelm, "StableLM").checks}
    assert checks.get("the KV cache it returns: tokens 5..7 handed the cache of 0..4 give the logits of the "
                      "whole sequence") is True, checks


def test_a_plant_in_the_block_is_named_and_the_loop_passes_on_the_stand_in(stablelm_normed):
    got = statuses(stablelm_normed)
    assert got["DecoderLayer"] == got["StableLM"] == "fail", format_report(stablelm_normed)
    assert got["StableLM.generate"] == "pass", format_report(stablelm_normed)  # no cache mismatch
    found = [(f.name, f.code) for f in component(stablelm_normed, "DecoderLayer").findings]
    assert ("residual_from_normed", "x = h + self.mlp(h)") in found


@pytest.fixture(scope="module")
def internlm():
    return check_file(str(INTERNLM))


@pytest.fixture(scope="module")
def internlm_planted(tmp_path_factory):
    """The labels cut at the end as the logits are, not moved on by one."""
    return check_file(edited_copy(tmp_path_factory.mktemp("planted"), INTERNLM, [
        ('target = batch["labels"][:, 1:]', 'target = batch["labels"][:, :-1]')]))


def test_block_of_wqkv_packed_by_group_with_a_required_mask_passes(internlm):
    assert set(statuses(internlm).values()) == {"pass"}, format_report(internlm)
    assert "group" in " ".join(component(internlm, "DecoderLayer").mapping)


def test_a_step_on_ids_and_labels_is_a_language_models_step(internlm):
    assert component(internlm, "train_step").kind == "lm_train_step"


def test_labels_not_shifted_are_named_where_they_are_cut(internlm_planted):
    found = [(f.name, f.code) for f in component(internlm_planted, "train_step").findings]
    assert found == [("train_step_no_shift", 'target = batch["labels"][:, :-1].reshape(-1)')], found

