"""`check` on Command-R (Cohere) written three ways (tests/fixtures/learners_command_r/): a parallel
block from one bias-free LayerNorm, interleaved rotary pairs, the head tied to the embedding, logits
times logit_scale, kept as a float (correct.py, hf_style.py: Hugging Face's early modeling_cohere, the
rotary module inside the attention and handed position_ids) or as a one-number buffer
(buffer_scale.py). Command R+'s per-head q/k LayerNorm gains (qk_norm_per_head.py), which no reference
holds, leave attention, layer and model NOT CHECKED, never FAIL. Plants: the logits divided by the
scale, the MLP handed the un-normed input."""

from __future__ import annotations

import pytest
from check_results import checked, component, named, statuses

from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = "learners_command_r"


@pytest.fixture(scope="module")
def correct():
    return checked(FOLDER)


def test_command_r_passes_with_its_generate(correct):
    assert set(statuses(correct).values()) == {"pass"}, format_report(correct)
    assert statuses(correct)["CommandR.generate"] == "pass"
    said = component(correct, "CommandR").convention["en"]
    assert "parallel blocks" in said and "interleaved pairs" in said and "logits times 0.0625" in said


def test_hugging_face_style_passes():
    result = checked(FOLDER, "hf_style", only=["gqa", "block", "gpt"])
    assert set(statuses(result).values()) == {"pass"}, format_report(result)


def test_logit_scale_held_as_a_buffer_is_read():
    result = checked(FOLDER, "buffer_scale", only=["gpt"])
    assert statuses(result) == {"CommandR": "pass"}, format_report(result)
    assert "logits times 0.0625 (read from your settings)" in component(result, "CommandR").convention["en"]


def test_logits_divided_by_the_scale_fail_at_their_line():
    result = checked(FOLDER, "scale_divided", only=["gpt"])
    assert named(result, "CommandR") == [("departs", "return logits / self.logit_scale")], format_report(result)


def test_mlp_of_the_unnormed_input_fails_at_its_line():
    result = checked(FOLDER, "mlp_unnormed", only=["block"])
    assert named(result, "ParallelBlock") == [("departs", "return x + self.self_attn(h) + self.mlp(x)")], (
        format_report(result))


def test_per_head_qk_norm_gains_are_named_not_failed():
    result = checked(FOLDER, "qk_norm_per_head", only=["gqa", "block", "gpt"])
    assert statuses(result) == {"CohereAttention": "not_checked", "repeat_kv": "pass",
                                "CohereDecoderLayer": "not_checked", "CohereForCausalLM": "not_checked"}, (
        format_report(result))
    assert "a gain for each head (q_norm (4, 4), k_norm (2, 4))" in component(result, "CohereAttention").error.message
