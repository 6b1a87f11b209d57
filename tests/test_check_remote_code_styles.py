"""Correct files in the styles of Hugging Face remote code and of Llama 3.2 rebuilt from scratch that
`handformer check` failed, each beside a plant that must still fail at its line:

- GLM-4 (batch-first ChatGLM): a bool mask that is True where hidden, filled with -inf, the causal mask
  built and inverted only when none is handed; rotary_pos_emb a (B, T, rot/2, 2) cache that turns the
  first half of each head in interleaved pairs; a returned KV cache whose causal mask exists only where
  query and key lengths are equal (checked one token at a time).
- Llama 3.2 with the llama3 rotary scaling from a rope_scaling dict, apply_llama3_scaling(freqs, config),
  the head tied to the embedding.
- Baichuan 2: NormHead (each row of the head's weight L2-normalised), W_pack, cached (1, 1, P, Dh)
  tables handed to apply_rotary_pos_emb(q, k, cos_, sin_, position_ids).
- DeepSeek-V2: a MoEGate module holding an (E, D) weight, group-limited routing, a routed scaling
  factor, shared experts and a first dense layer.
"""

from __future__ import annotations

import pytest
from check_results import checked, component, notes, statuses

from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")


def named(result, name):
    return [(f.name, (f.code or "").strip()) for f in component(result, name).findings]


@pytest.fixture(scope="module")
def glm4():
    return checked("learners_glm4")


def test_glm4_mask_true_where_hidden_rotary_cache_and_returned_cache_pass(glm4):
    assert statuses(glm4) == {"CoreAttention": "differs", "SelfAttention": "pass",
                              "apply_rotary_pos_emb": "pass", "RotaryEmbedding": "pass", "MLP": "pass",
                              "RMSNorm": "pass", "GLMBlock": "pass", "ChatGLMModel": "pass"}, format_report(glm4)
    assert "True = masked" in component(glm4, "SelfAttention").convention["en"]
    assert "one at a time" in notes(glm4, "ChatGLMModel")


def test_glm4_rotation_of_the_wrong_sign_is_quoted():
    planted = checked("learners_glm4", "rope_sign", only=["rope", "gqa"])
    for name in ("SelfAttention", "apply_rotary_pos_emb"):
        assert named(planted, name) == [
            ("rope_rotation_sign", "first = pairs[..., 0] * c[..., 0] + pairs[..., 1] * c[..., 1]")], (
            format_report(planted))


@pytest.fixture(scope="module")
def llama3():
    return checked("learners_llama3_scaling")


def test_llama3_scaling_read_from_the_tables_and_handed_a_config(llama3):
    assert set(statuses(llama3).values()) == {"pass"}, format_report(llama3)
    assert "Llama 3.1's rotary frequency scaling (factor 32" in (
        component(llama3, "Llama").convention["en"])
    assert "handed in its config" in notes(llama3, "apply_llama3_scaling")


def test_llama3_blend_swapped_fails_at_its_line():
    planted = checked("learners_llama3_scaling", "blend_swapped", only=["rope_scaling", "gpt"])
    assert statuses(planted) == {"apply_llama3_scaling": "fail", "Llama": "fail"}, format_report(planted)
    assert named(planted, "apply_llama3_scaling") == [
        ("departs", 'blended = smooth * freqs / s["factor"] + (1 - smooth) * freqs')], format_report(planted)


@pytest.fixture(scope="module")
def baichuan2():
    return checked("learners_baichuan2")


def test_baichuan2_norm_head_and_cached_tables_pass(baichuan2):
    assert set(statuses(baichuan2).values()) == {"pass"}, format_report(baichuan2)
    assert "each row L2-normalised" in component(baichuan2, "BaichuanForCausalLM").convention["en"]


def test_baichuan2_head_normalised_by_columns_fails_at_its_line():
    planted = checked("learners_baichuan2", "head_columns", only=["gpt"])
    assert statuses(planted) == {"BaichuanForCausalLM": "fail"}, format_report(planted)
    assert [code for _, code in named(planted, "BaichuanForCausalLM")] == [
        "return F.linear(hidden_states, F.normalize(self.weight, dim=0))"], format_report(planted)


@pytest.fixture(scope="module")
def deepseek():
    return checked("learners_deepseek_gate")


def test_deepseek_gate_module_routing_passes(deepseek):
    assert statuses(deepseek) == {"DeepseekV2Attention": "pass", "DeepseekV2MLP": "pass",
                                  "DeepseekV2MoE": "pass", "DeepseekV2RMSNorm": "pass",
                                  "DeepseekV2DecoderLayer": "pass", "DeepseekV2ForCausalLM": "pass"}, (
        format_report(deepseek))
    assert "mixture of 4 experts" in notes(deepseek, "DeepseekV2ForCausalLM")


def test_deepseek_weights_not_renormalized_named_at_the_condition():
    planted = checked("learners_deepseek_gate", "not_renormalized", only=["moe"])
    assert named(planted, "DeepseekV2MoE") == [
        ("moe_weights_not_renormalized", "if self.top_k > 1 and not self.norm_topk_prob:")], format_report(planted)
