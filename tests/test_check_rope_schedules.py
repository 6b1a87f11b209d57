"""`check` on rotary modules that hold their own scaled frequencies (Llama 3.1's "llama3" schedule),
in two layouts: Hugging Face's LlamaRotaryEmbedding (inv_freq, a config's rope_scaling dict, (cos, sin)
for position_ids) and torchtune's Llama3ScaledRoPE (a `theta` buffer, its settings as attributes,
interleaved pairs rotated in place). The rotation is checked with the frequencies held, the frequencies
apart against the known schedules; a plant in the blend fails at its line, never rope_wrong_base. A
module with position interpolation ("linear", its config not kept) is read from its frequencies alone."""

from __future__ import annotations

import pytest
from check_results import checked, component, named, statuses

from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

BLEND = "the frequencies whose wavelength is between the two bounds (blended) are not Llama 3.1's"


@pytest.fixture(scope="module")
def hf():
    return checked("learners_llama31_rotary", only=["rope", "gpt"])


def test_hf_inv_freq_held_scaled_passes_read_as_llama3(hf):
    assert statuses(hf) == {"apply_rotary_pos_emb": "pass", "LlamaRotaryEmbedding": "pass",
                            "LlamaForCausalLM": "pass"}, format_report(hf)
    checks = " ".join(c.name["en"] for c in component(hf, "LlamaRotaryEmbedding").checks)
    assert "the frequencies it holds are base 10000's with Llama 3.1's rotary frequency scaling (factor 8" in (
        checks)
    assert "Llama 3.1's rotary frequency scaling (factor 8" in component(hf, "LlamaForCausalLM").convention["en"]


def test_hf_blend_swapped_fails_at_its_line_in_module_and_model():
    planted = checked("learners_llama31_rotary", "blend_swapped", only=["rope", "gpt"])
    line = ("smoothed_inv_freq = smooth_factor * inv_freq_llama / factor + (1 - smooth_factor) * "
            "inv_freq_llama")
    assert statuses(planted)["LlamaRotaryEmbedding"] == "fail", format_report(planted)
    assert statuses(planted)["LlamaForCausalLM"] == "fail", format_report(planted)
    for name in ("LlamaRotaryEmbedding", "LlamaForCausalLM"):
        assert [f for f, _ in named(planted, name)] == ["departs"], format_report(planted)
        assert named(planted, name)[0][1].strip() == line
    assert BLEND in component(planted, "LlamaRotaryEmbedding").findings[0].observed["en"]


@pytest.fixture(scope="module")
def torchtune():
    return checked("learners_llama31_scaled_rope", only=["rope", "gpt"])


def test_torchtune_theta_buffer_rotated_in_place_passes(torchtune):
    assert statuses(torchtune) == {"Llama3ScaledRoPE": "pass", "TransformerDecoder": "pass"}, (
        format_report(torchtune))
    checks = " ".join(c.name["en"] for c in component(torchtune, "Llama3ScaledRoPE").checks)
    assert "Llama 3.1's rotary frequency scaling" in checks and "interleaved pairs" in checks


def test_torchtune_blend_swapped_fails_at_its_line():
    planted = checked("learners_llama31_scaled_rope", "blend_swapped", only=["rope"])
    assert statuses(planted) == {"Llama3ScaledRoPE": "fail"}, format_report(planted)
    assert named(planted, "Llama3ScaledRoPE") == [
        ("departs", "new_freqs.append((1 - smooth) * freq + smooth * freq / self.scale_factor)")], (
        format_report(planted))


def test_linear_scaling_read_from_the_frequencies_alone():
    result = checked("learners_llama31_rotary", "linear_scaling", only=["rope"])
    assert statuses(result) == {"LinearScalingRotaryEmbedding": "pass"}, format_report(result)
    checks = " ".join(c.name["en"] for c in component(result, "LinearScalingRotaryEmbedding").checks)
    assert "linear (position interpolation) rotary frequency scaling (factor 4)" in checks
