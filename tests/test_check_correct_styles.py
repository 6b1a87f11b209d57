"""Correct code in five styles that `handformer check` failed, each beside a plant that must still fail:

- fairseq's decoder layer: time-first, its causal mask built from the stream (`future_mask(tensor)`:
  tensor.size(0)), handed as one additive (T, T) attn_mask beside the source's padding (B, S);
- lucidrains' norms, which keep no eps: `F.normalize(x, dim=-1) * sqrt(d) * g` (an RMSNorm without
  eps) and a LayerNorm with its eps written into the forward: the eps is read from what they compute;
- an OLMo block whose FFN is mlp_ratio * d_model rows of one fused projection, halved by its SwiGLU:
  at a ratio of 2 its down projection is as square as the attention's output projection;
- T5's mask helper, which takes the tokenizer's attention_mask (1 = token), not ids;
- nlp-tutorial's encoder (the Chinese tutorials copy it): hyperparameters at module level bound as
  defaults (`def __init__(self, emb_size=emb_size)`), the score function built inside the forward
  (`ScaledDotProductAttention()(Q, K, V, mask)`, True = masked, so its pad mask helper writes True =
  pad), the residual and LayerNorm inside the attention, which requires its mask, and a
  `PoswiseFeedForwardNet` whose linears sit in one nn.Sequential (quoted there when its ReLU is missing).
"""

from __future__ import annotations

import pytest
from check_results import checked, component, named, notes, statuses

from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def fairseq():
    return checked("learners_fairseq_layers")


def test_fairseq_decoder_layer_takes_one_causal_attn_mask_and_its_mask_reads_the_stream(fairseq):
    assert statuses(fairseq) == {"future_mask": "pass", "SelfAttention": "pass", "DecoderLayer": "pass"}, \
        format_report(fairseq)
    assert "reads the length from a tensor's size" in notes(fairseq, "future_mask")
    assert "one (T, T) for the whole batch" in notes(fairseq, "DecoderLayer")
    assert "additive attn_mask (T, S)" in component(fairseq, "DecoderLayer").convention["en"]


def test_fairseq_plants_still_fail():
    sees_next = checked("learners_fairseq_layers", "future_sees_next", only=["causal_mask"])
    assert named(sees_next, "future_mask") == [("causal_off_by_one", "return torch.triu(mask, 2).to(tensor)")]
    no_residual = checked("learners_fairseq_layers", "ffn_no_residual", only=["decoder_layer"])
    assert statuses(no_residual) == {"DecoderLayer": "fail"}, format_report(no_residual)
    assert [name for name, _ in named(no_residual, "DecoderLayer")] == ["no_residual"]


@pytest.fixture(scope="module")
def norms():
    return checked("learners_lucidrains_norms")


def test_norms_that_keep_no_eps_are_compared_at_the_eps_they_compute(norms):
    assert statuses(norms) == {"RMSNorm": "pass", "LayerNorm": "pass"}, format_report(norms)
    assert "eps = 0: your module keeps none, so it was read from what it computes" in notes(norms, "RMSNorm")
    assert "eps = 1e-06: your module keeps none" in notes(norms, "LayerNorm")


def test_norm_plants_without_eps_still_fail():
    unscaled = checked("learners_lucidrains_norms", "rms_unscaled", only=["rmsnorm"])
    assert statuses(unscaled) == {"RMSNorm": "fail"}, format_report(unscaled)
    assert "the default of torch's norm" in notes(unscaled, "RMSNorm")
    unbiased = checked("learners_lucidrains_norms", "unbiased_variance", only=["layernorm"])
    assert statuses(unbiased) == {"LayerNorm": "fail"}, format_report(unbiased)


def test_olmo_fused_ffn_from_its_mlp_ratio_is_mapped_with_its_down_projection():
    result = checked("learners_olmo_config", only=["block"])
    assert statuses(result) == {"OLMoBlock": "pass"}, format_report(result)
    assert "ff_out -> FFN W_down" in component(result, "OLMoBlock").mapping
    planted = checked("learners_olmo_config", "not_causal", only=["block"])
    assert [name for name, _ in named(planted, "OLMoBlock")] == ["causal_mask_missing"], format_report(planted)


def test_t5_mask_helper_is_handed_an_attention_mask_not_ids():
    result = checked("learners_t5_masks")
    assert statuses(result) == {"build_attention_mask": "pass"}, format_report(result)
    assert "takes the padding as a mask (attention_mask" in notes(result, "build_attention_mask")
    assert statuses(checked("learners_t5_masks", "inverted")) == {"build_attention_mask": "fail"}


@pytest.fixture(scope="module")
def nlp_tutorial():
    return checked("learners_zh_nlp_tutorial")


def test_nlp_tutorial_encoder_with_defaults_bound_to_its_hyperparameters(nlp_tutorial):
    assert statuses(nlp_tutorial) == {"get_pad_mask": "pass", "ScaledDotProductAttention": "pass",
                                      "MultiHeadAttention": "pass", "PoswiseFeedForwardNet": "pass",
                                      "EncoderLayer": "pass"}, format_report(nlp_tutorial)
    assert "True = masked" in component(nlp_tutorial, "EncoderLayer").convention["en"]
    assert "its output is norm(q + attention)" in notes(nlp_tutorial, "MultiHeadAttention")
    assert "emb_size=16" in notes(nlp_tutorial, "EncoderLayer")


def test_nlp_tutorial_plants_fail_at_their_lines():
    result = checked("learners_zh_nlp_tutorial", "no_transpose", only=["mha", "encoder_layer"])
    assert statuses(result) == {"MultiHeadAttention": "fail", "EncoderLayer": "fail"}, format_report(result)
    assert named(result, "MultiHeadAttention")[0] == (
        "concat_no_transpose", "context = context.reshape(B, -1, self.num_heads * head_dim)  # [B, len_q, h*d]")
    inverted = checked("learners_zh_nlp_tutorial", "pad_mask_inverted", only=["mask_helper"])
    assert named(inverted, "get_pad_mask") == [
        ("mask_inverted", "return seq_k.ne(0).unsqueeze(1).expand(-1, len_q, -1)  # [B, len_q, len_k]")]
    no_relu = checked("learners_zh_nlp_tutorial", "no_relu", only=["ffn"])
    assert named(no_relu, "PoswiseFeedForwardNet") == [
        ("ffn_no_activation", "self.net = nn.Sequential(nn.Linear(emb_size, ffn_size), nn.Linear(ffn_size, emb_size))")]
