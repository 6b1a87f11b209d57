"""`handformer check` builds and drives whole models and steps that learners write in four styles:
OLMo 2 (q_norm and k_norm over all heads, k_norm as wide as the key heads under grouped-query
attention; norms after each sublayer inside the residual; a step that hands its token ids to the
model as the labels too), a Chinese SFT loop (a dict batch whose shift lives in a loss function of
the file), DistilBERT for masked language modelling (an encoder-only model found by its name as a
GPT; a stack of vectors whose layers read their mask) and nanoGPT with experts in every other block
(not compared, said why; its router's noise left on in eval mode quoted at the `if` it sits under)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"


def _check(folder: str, name: str, only: list[str] | None = None):
    return check_file(str(FIXTURES / folder / name), only=only)


@pytest.fixture(scope="module")
def olmo():
    return _check("learners_olmo2_wide", "correct.py")


@pytest.fixture(scope="module")
def olmo_k_norm_skipped():
    return _check("learners_olmo2_wide", "k_norm_skipped.py", ["gqa"])


@pytest.fixture(scope="module")
def olmo_clip_late():
    return _check("learners_olmo2_wide", "clip_late.py", ["lm_train_step"])


@pytest.fixture(scope="module")
def sft():
    return _check("learners_zh_sft", "correct.py")


@pytest.fixture(scope="module")
def sft_no_shift():
    return _check("learners_zh_sft", "no_shift.py")


@pytest.fixture(scope="module")
def distil():
    return _check("learners_distil_mlm", "correct.py", ["gpt", "encoder_model"])


@pytest.fixture(scope="module")
def distil_mask_flipped():
    return _check("learners_distil_mlm", "mask_flipped.py", ["encoder_model"])


@pytest.fixture(scope="module")
def moe():
    return _check("learners_nanomoe", "correct.py", ["gpt"])


@pytest.fixture(scope="module")
def moe_noisy():
    return _check("learners_nanomoe", "noisy_in_eval.py", ["gpt"])


def _status(result) -> dict[str, str]:
    return {c.name: c.status for c in result.components}


def _found(result, component: str) -> list[tuple[str, str | None]]:
    comp = next(c for c in result.components if c.name == component)
    return [(f.name, f.code) for f in comp.findings]


def test_olmo2_wide_qk_norms_reordered_blocks_and_labels_step_all_pass(olmo):
    assert _status(olmo) == {"OlmoAttention": "pass", "OlmoMLP": "pass", "OlmoRMSNorm": "pass",
                             "OlmoDecoderLayer": "pass", "OlmoForCausalLM": "pass", "train_step": "pass"}, (
        format_report(olmo))
    model = next(c for c in olmo.components if c.name == "OlmoForCausalLM")
    assert "x + norm(f(x))" in model.convention["en"], format_report(olmo)


def test_olmo2_keys_left_unnormed_fail_the_attention(olmo_k_norm_skipped):
    assert _status(olmo_k_norm_skipped) == {"OlmoAttention": "fail"}, format_report(olmo_k_norm_skipped)


def test_olmo2_clipping_after_the_update_is_named_at_its_line(olmo_clip_late):
    assert _found(olmo_clip_late, "train_step") == [
        ("train_step_clip_after_step", "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)")], (
        format_report(olmo_clip_late))


def test_sft_step_with_its_shift_in_a_loss_function_passes(sft):
    assert _status(sft) == {"sft_step": "pass"}, format_report(sft)


def test_sft_labels_not_shifted_are_named_in_the_loss_function(sft_no_shift):
    assert _found(sft_no_shift, "sft_step") == [("train_step_no_shift", "gold = labels[:, :-1]")], (
        format_report(sft_no_shift))


def test_distilbert_stack_and_masked_lm_are_checked_and_pass(distil):
    assert _status(distil) == {"Transformer": "pass", "DistilBertForMaskedLM": "pass"}, format_report(distil)
    model = next(c for c in distil.components if c.name == "DistilBertForMaskedLM")
    assert model.kind == "encoder_model", format_report(distil)


def test_distilbert_mask_read_the_wrong_way_fails_the_model_at_the_comparison(distil_mask_flipped):
    assert _found(distil_mask_flipped, "DistilBertForMaskedLM") == [
        ("mask_inverted", "hidden = (mask == 1)[:, None, None, :]  # (bs, 1, 1, k_len)")], (
        format_report(distil_mask_flipped))


def test_experts_in_every_other_block_are_not_compared_and_say_why(moe):
    (gpt,) = moe.components
    why = gpt.error.message  # (its blocks alike or not: its experts are ReLU networks with biases)
    assert gpt.status == "not_checked" and ("not all built alike" in why or "its experts are not" in why), (
        format_report(moe))


def test_router_noise_in_eval_mode_fails_at_the_if_that_lets_it_run(moe_noisy):
    assert _found(moe_noisy, "GPT") == [("dropout_in_eval", "if self.noisy:")], format_report(moe_noisy)
