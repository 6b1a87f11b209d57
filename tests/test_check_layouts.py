"""Styles check drives by what the code does, each with a plant that fails and its correct twin: masks
that say True = masked read so per component (a standalone attention as its file's layers), graykode's
get_attn_pad_mask(seq_q, seq_k), and a language model's step with gradient accumulation driven with
more than one micro-batch."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

LAYOUTS = Path(__file__).parent / "fixtures" / "learners_layouts" / "correct.py"


def _planted(tmp_path: Path, edits: list[tuple[str, str]], source: Path = LAYOUTS) -> str:
    return edited_copy(tmp_path, source, edits)


SCALE_BY_DK = [("/ math.sqrt(Q.size(-1))", "/ Q.size(-1)")]


@pytest.mark.parametrize("planted", [False, True])
def test_an_attention_whose_mask_says_true_is_masked_is_read_so(tmp_path, planted):
    """masked_fill(attn_mask, -1e9) in the attention (or in the class it holds): torch.nn's convention
    is tried first, so the correct twin passes and a plant is named for its own mistake alone."""
    result = check_file(_planted(tmp_path, SCALE_BY_DK * planted), only=["mask_helper", "sdpa", "mha"])
    helper, sdpa, mha = result.components
    assert helper.status == "pass", format_report(result)
    for comp in (sdpa, mha):
        assert "True = masked" in comp.convention["en"], format_report(result)
        assert [f.name for f in comp.findings] == (["scale_by_dk"] if planted else []), format_report(result)
        assert comp.status == ("fail" if planted else "pass"), format_report(result)


@pytest.mark.parametrize("planted", [False, True])
def test_a_step_with_gradient_accumulation_is_driven_with_two_micro_batches(tmp_path, planted):
    edits = [("(loss / grad_accum_steps).backward()", "loss.backward()")] * planted
    result = check_file(_planted(tmp_path, edits), only=["lm_train_step"])
    (step,) = result.components
    assert any("grad_accum_steps=2" in n["en"] for n in step.notes), format_report(result)
    assert [f.name for f in step.findings] == (["train_step_loss_not_divided"] if planted else [])
    assert step.status == ("fail" if planted else "pass"), format_report(result)


GPT2 = LAYOUTS.parent / "gpt2_conv1d.py"
GPT2_PLANTS = {  # (edits, the component that fails, its finding, the line quoted)
    "correct": ([], None, None, None),
    "scale_by_dk": ([("w = w / (v.size(-1) ** 0.5)", "w = w / v.size(-1)")], "GPT2Attention", "scale_by_dk",
                    "w = w / v.size(-1)"),
    "gelu_sqrt_2pi": ([("math.sqrt(2.0 / math.pi)", "math.sqrt(2.0 * math.pi)")], "GPT2MLP", None,
                      "math.sqrt(2.0 * math.pi)"),
}


@pytest.mark.parametrize("plant", list(GPT2_PLANTS))
def test_gpt2_conv1d_weights_stored_in_out_are_read_transposed(tmp_path, plant):
    """Hugging Face's Conv1D (x @ weight + bias, the weight (in, out)) is found by what it computes and
    read transposed: the packed c_attn is split into W_Q, W_K, W_V, and the components are checked."""
    edits, failing, named, line = GPT2_PLANTS[plant]
    result = check_file(_planted(tmp_path, edits, GPT2), only=["causal_attention", "ffn"])
    attention, mlp = result.components
    assert attention.mapping[0] == "c_attn.T[0:16] -> W_Q" and mlp.mapping[0] == "c_fc.T -> FFN W_1"
    for comp in (attention, mlp):
        assert comp.status == ("fail" if comp.name == failing else "pass"), format_report(result)
    if failing:
        comp = attention if failing == "GPT2Attention" else mlp
        assert [f.name for f in comp.named()] == ([named] if named else []), format_report(result)
        assert line in format_report(result), format_report(result)


def test_a_model_with_hugging_face_s_lm_head_is_found_beside_its_backbone():
    """GPT2LMHeadModel (beside the GPT2Model it wraps) is the model checked, its blocks' Conv1D read."""
    result = check_file(str(GPT2), only=["gpt"])
    (model,) = result.components
    assert (model.name, model.status) == ("GPT2LMHeadModel", "pass"), format_report(result)


DECODING = LAYOUTS.parents[1] / "course" / "ch09_decoding.py"
TIMES_ALPHA = ("done.append((score / (len(tokens) - 1) ** alpha, tokens))",
               "done.append((score / (len(tokens) - 1) * alpha, tokens))")


@pytest.mark.parametrize("planted", [False, True])
def test_a_length_penalty_that_multiplies_by_alpha_shows_at_alpha_zero(tmp_path, planted):
    """score / length * alpha ranks as alpha 1 at every alpha > 0: the search is driven at alpha 0 too,
    and the lines that read alpha are quoted."""
    result = check_file(_planted(tmp_path, [TIMES_ALPHA] * planted, DECODING), only=["beam_search"])
    (beam,) = result.components
    (zero,) = [c for c in beam.checks if c.name["en"].startswith("with alpha = 0")]
    assert zero.ok != planted and beam.status == ("fail" if planted else "pass"), format_report(result)
    assert not planted or "line 37: done.append((score / (len(tokens) - 1) * alpha" in format_report(result)


TOP_K_DROPS_KTH = ("logits[logits < v[:, [-1]]]", "logits[logits <= v[:, [-1]]]")


@pytest.mark.parametrize("planted", [False, True])
def test_a_loop_that_takes_top_k_is_driven_with_top_k_one(tmp_path, planted):
    """minGPT's generate(idx, max_new_tokens, temperature, do_sample, top_k) keeps one token at top_k=1:
    greedy's; a filter that drops the k-th keeps none, and the line that filters is quoted."""
    result = check_file(_planted(tmp_path, [TOP_K_DROPS_KTH] * planted), only=["generate"])
    (loop,) = result.components
    (top_one,) = [c for c in loop.checks if "top_k=1" in c.name["en"]]
    assert top_one.ok != planted and loop.status == ("fail" if planted else "pass"), format_report(result)
    assert not planted or "line 64: logits[logits <= v[:, [-1]]]" in format_report(result), format_report(result)


SEQ_FIRST = LAYOUTS.parent / "seq_first.py"


@pytest.mark.parametrize("planted", [False, True])
def test_a_sequence_first_layout_is_found_by_what_the_forward_does_and_driven_so(tmp_path, planted):
    """(T, B, D) in and out, as PyTorch's tutorial writes it: the encoding, the attention (its masks as
    nn.MultiheadAttention's attn_mask) and the layer are driven so, and say it; a plant is named."""
    edits = [("/ math.sqrt(self.head_dim)", "/ self.head_dim")] * planted
    result = check_file(_planted(tmp_path, edits, SEQ_FIRST), only=["positional_encoding", "mha", "encoder_layer"])
    mha, pe, layer = result.components
    for comp in (pe, mha, layer):
        assert any("sequence-first" in n["en"] for n in comp.notes), format_report(result)
    assert pe.status == "pass" and "(B * H, T, S)" in mha.convention["en"], format_report(result)
    for comp in (mha, layer):
        assert comp.status == ("fail" if planted else "pass"), format_report(result)
        assert [f.name for f in comp.findings] == (["scale_by_dk"] if planted else []), format_report(result)


NEOX = LAYOUTS.parent / "neox_falcon_moe.py"
NEOX_PLANTS = {  # (edits, the kind checked, the component that fails)
    "correct": ([], ["causal_attention", "block"], None),
    "parallel_mlp_unnormed": ([("self.mlp(self.post_attention_layernorm(x))", "self.mlp(x)")], ["block"],
                              "NeoXLayer"),
    "mqa_value_reads_key": ([("fused[:, :, [-2]], fused[:, :, [-1]]", "fused[:, :, [-2]], fused[:, :, [-2]]")],
                            ["causal_attention"], "FalconAttention"),
    "moe_unweighted": ([("out[b, t] += weights[b, t, slot, None] * expert(x[b, t])",
                         "out[b, t] += expert(x[b, t])")], ["block"], "MixtralBlock"),
}


@pytest.mark.parametrize("plant", list(NEOX_PLANTS))
def test_fused_layouts_parallel_blocks_and_experts_are_read_by_what_they_compute(tmp_path, plant):
    """GPT-NeoX's per-head [q | k | v] and Falcon's multi-query projection are split as one token shows,
    a parallel block is a convention, a sparse mixture of experts is compared with handformer's
    MixtureOfExperts: the correct twin passes every component, each plant fails its own."""
    edits, kinds, failing = NEOX_PLANTS[plant]
    result = check_file(_planted(tmp_path, edits, NEOX), only=kinds)
    by = {c.name: c for c in result.components}
    assert {c.name for c in result.components if c.status != "pass"} == ({failing} if failing else set()), (
        format_report(result))
    if not failing:
        assert by["NeoXAttention"].mapping[0] == "query_key_value[q of each [q | k | v] group] -> W_Q"
        assert by["FalconAttention"].mapping[1] == "query_key_value[16:20] -> W_K"  # one key head of 4 dims
        assert any("in parallel" in n["en"] for n in by["NeoXLayer"].notes), format_report(result)
        assert "moe.gate -> router" in by["MixtralBlock"].mapping, format_report(result)


POSITIONS = LAYOUTS.parent / "positions.py"
T5_SCALED = ('sim = torch.einsum("bihd,bjhd->bhij", q, k)  # unscaled: T5 folds 1/sqrt(d) into its init',
             'sim = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.size(-1))')
POSITION_PLANTS = {  # (edit, {kind: the component checked}, its finding or None, the line the report quotes)
    "t5_bucket_direction": (("after = (offset > 0).long() * half", "after = (offset < 0).long() * half"),
                            {"mha": "RelativeAttention"}, None,
                            "line 39: sim = sim + self.rel_bias(buckets).permute(2, 0, 1)"),
    "t5_scaled": (T5_SCALED, {"mha": "RelativeAttention"}, None, f"line 36: {T5_SCALED[1]}"),
    "alibi_unscaled": (("* (q.size(-1) ** -0.5) + alibi", "+ alibi"), {"causal_attention": "AlibiAttention"},
                       "no_scaling", "line 69: scores = q @ k.transpose(-1, -2) + alibi"),
    "rotation_sign": (("torch.stack((-x[..., 1::2], x[..., ::2])", "torch.stack((x[..., 1::2], -x[..., ::2])"),
                      {"causal_attention": "PartialRotaryAttention"}, "rope_rotation_sign", "line 89: return"),
    "parallel_mlp_unnormed": (("self.attn(h) + self.mlp(h)", "self.attn(h) + self.mlp(x)"),
                              {"block": "ParallelBlock"}, None, "line 130: return x + self.attn(h) + self.mlp(x)"),
}


def test_positions_as_a_term_on_the_scores_and_partial_interleaved_rotary_are_conventions():
    """T5's learned relative-position bias (its unscaled scores a convention: DIFFERS, also in a layer
    handed the bias by its caller), ALiBi's slopes on
    the scaled scores, GPT-J's partial interleaved rotary with k_proj, v_proj, q_proj defined in that
    order (its apply function handed one angle a pair, (T, Dh/2); transformers 5's attention handed
    (sin, cos), (B, T, Dh/2) each), and the blocks built on them: found by what the attention holds and
    says, compared so."""
    result = check_file(str(POSITIONS), only=["rope", "mha", "causal_attention", "block"])
    by = {c.name: c for c in result.components}
    assert {n: c.status for n, c in by.items()} == {
        "apply_rotary_pos_emb": "pass", "RelativeAttention": "differs", "LaterLayerAttention": "differs",
        "HandedRotaryAttention": "pass", "AlibiAttention": "pass", "PartialRotaryAttention": "pass",
        "AlibiBlock": "pass", "ParallelBlock": "pass"}, format_report(result)
    assert "rel_bias -> relative position bias" in by["RelativeAttention"].mapping
    assert all(any("not divided by sqrt(d_k)" in n["en"] for n in by[name].notes)
               for name in ("RelativeAttention", "LaterLayerAttention")), format_report(result)
    assert by["PartialRotaryAttention"].mapping[0] == "q_proj -> W_Q", format_report(result)
    assert all(any("ALiBi inside" in n["en"] for n in by[name].notes) for name in ("AlibiAttention", "AlibiBlock"))


@pytest.mark.parametrize("plant", list(POSITION_PLANTS))
def test_a_plant_in_the_positions_styles_fails_at_its_line(tmp_path, plant):
    """Each plant FAILs its component, named where the catalogue has it, its line quoted."""
    edit, overrides, named, line = POSITION_PLANTS[plant]
    result = check_file(_planted(tmp_path, [edit], POSITIONS), overrides=overrides, only=list(overrides))
    (comp,) = [c for c in result.components if c.name in overrides.values()]
    assert comp.status == "fail" and [f.name for f in comp.named()] == ([named] if named else []), (
        format_report(result))
    assert line in format_report(result), format_report(result)
