"""`handformer check` on conventions correct code uses that once read as mistakes, each with a correct
file that passes and a planted one that fails at its line: Keras-style masks of 1 = hidden added as
mask * -1e9, an attention whose output projection lives in a sibling module (Hugging Face's ViT and
BERT layout), nn.Transformer's four masks made from sequence-first ids, a model on nn.Transformer in
its (S, B) layout with a greedy loop that stops at a module-level END, and a beam search that calls its
model as model(src, tgt)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy
from helpers import assert_failed_at, statuses

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_conventions"


def test_masks_of_ones_added_times_a_large_negative_pass():
    result = check_file(str(HERE / "masked_ones.py"))
    assert statuses(result) == {"look_ahead_mask": "pass", "padding_mask": "pass", "attention": "pass",
                                 "MultiHeadedAttention": "pass"}, format_report(result)


@pytest.mark.parametrize(("old", "new", "kind", "name"), [
    ("diagonal=1)", "diagonal=0)", "causal_mask", "causal_off_by_one"),
    ("weights = logits.softmax(dim=-1)", "weights = logits.softmax(dim=-2)", "mha", ""),
])
def test_each_masked_ones_plant_fails(tmp_path, old, new, kind, name):
    result = check_file(edited_copy(tmp_path, HERE / "masked_ones.py", [(old, new)]), only=[kind])
    assert_failed_at(result, name, new.strip())


@pytest.mark.parametrize(("old", "new", "name"), [
    (None, None, None),
    ("diagonal=1)", "diagonal=0)", "causal_off_by_one"),
    ("return torch.triu", "return ~torch.triu", "mask_inverted")])
def test_a_mask_handed_to_torch_s_transformer_is_read_as_torch_s(tmp_path, old, new, name):
    """A bool mask function whose masks only torch's nn.Transformer reads is True = masked, as
    torch.nn's masks are: right as written; its planted mistakes still fail, at their line."""
    path = HERE / "bool_mask_for_torch.py"
    result = check_file(edited_copy(tmp_path, path, [(old, new)]) if old else str(path), only=["causal_mask"])
    if old is None:
        assert statuses(result) == {"subsequent_mask": "pass"}, format_report(result)
        assert "torch.nn's" in format_report(result)
    else:
        assert_failed_at(result, name, new)


def test_an_attention_whose_projection_a_sibling_holds_passes(tmp_path):
    result = check_file(str(HERE / "vit_split.py"), only=["mha"])
    heads = next(c for c in result.components if c.name == "ViTSelfAttention")
    assert heads.status == "pass", format_report(result)
    assert any("ViTAttention hands its output to ViTSelfOutput" in n["en"] for n in heads.notes)
    assert "fail" not in statuses(result).values(), format_report(result)
    unused = edited_copy(tmp_path, HERE / "vit_split.py", [(
        "return self.output(self_outputs[0], hidden_states)", "return self_outputs[0]")])
    assert_failed_at(check_file(unused, only=["mha"]), "no_output_projection", "class ViTSelfAttention")
    wrong_dim = edited_copy(tmp_path, HERE / "vit_split.py", [("math.sqrt(self.attention_head_size), dim=-1)",
                                                               "math.sqrt(self.attention_head_size), dim=-2)")])
    assert_failed_at(check_file(wrong_dim, only=["mha"]), "softmax_wrong_dim", "dim=-2")


def test_torch_masks_from_sequence_first_ids_pass(tmp_path):
    result = check_file(str(HERE / "seq_first_masks.py"), only=["mask_helper"])
    (helper,) = result.components
    assert helper.status == "pass", format_report(result)
    assert any("sequence-first" in n["en"] for n in helper.notes)
    swapped = edited_copy(tmp_path, HERE / "seq_first_masks.py", [("(src == PAD_ID).T, (tgt", "(tgt == PAD_ID).T, (tgt")])
    assert_failed_at(check_file(swapped, only=["mask_helper"]), "mask_pad_wrong_sequence", "(tgt == PAD_ID).T, (tgt")


def test_beam_search_over_model_of_src_and_tgt_passes(tmp_path):
    result = check_file(str(HERE / "beam_two_inputs.py"), only=["beam_search"])
    assert statuses(result) == {"beam_search": "pass"}, format_report(result)
    gnmt = edited_copy(tmp_path, HERE / "beam_two_inputs.py", [("(len(h[1]) - 1) ** alpha",
                                                                 "((5 + len(h[1]) - 1) / 6) ** alpha")])
    (beam,) = check_file(gnmt, only=["beam_search"]).components
    assert beam.status == "pass" and "GNMT" in beam.convention["en"], beam
    first = edited_copy(tmp_path, HERE / "beam_two_inputs.py", [(
        "return max(done, key=lambda h: h[0] / (len(h[1]) - 1) ** alpha)[1]", "return done[0][1]")])
    assert_failed_at(check_file(first, only=["beam_search"]), "beam_shortest_returned", "")


def test_a_sequence_first_torch_model_and_its_greedy_loop_pass(tmp_path):
    """nn.Transformer in its default (S, B) layout: the model driven sequence-first, its greedy loop
    handed (S, 1) ids and stopping at the module's END, set to check's EOS; a loop that never stops
    there fails."""
    result = check_file(str(HERE / "seq_first_translator.py"), only=["transformer", "greedy_decode"])
    assert statuses(result) == {"Seq2Seq": "pass", "greedy_decode": "pass"}, format_report(result)
    model, greedy = result.components
    assert any("sequence-first" in n["en"] for n in model.notes)
    assert any("your module's END is the one it must stop at" in n["en"] for n in greedy.notes)
    padded = edited_copy(tmp_path, HERE / "seq_first_translator.py", [("if token == END:", "if token == PAD:")])
    assert_failed_at(check_file(padded, only=["transformer", "greedy_decode"]), "greedy_no_stop_at_eos", "")


def test_encoder_sublayers_and_rotary_tables_pass():
    """Heads whose layer applies W_O, T5's pre-norm sublayer and BERT's post-norm wrapper, rotary from
    a table of sin and cos interleaved and from position ids and a base; a model with segment
    embeddings is no GPT."""
    result = check_file(str(HERE / "encoder_sublayers.py"), only=["mha", "rope", "gpt"])
    assert statuses(result) == {"HeadsAttention": "pass", "PreNormAttention": "pass", "ScaleFreeAttention": "differs",
                                 "WrappedAttention": "pass", "apply_rotary": "pass", "apply_rotary_pos_emb": "pass"
                                 }, format_report(result)
    heads = next(c for c in result.components if c.name == "HeadsAttention")
    assert any("EncoderUnit hands its output to self.merge" in n["en"] for n in heads.notes), format_report(result)


@pytest.mark.parametrize(("old", "new", "kind", "name"), [
    ("x = x + self.drop(y)", "x = self.norm(x) + self.drop(y)", "mha", "residual_from_normed"),
    ("ms = x.pow(2).mean(-1, keepdim=True)", "ms = x.pow(2).sum(-1, keepdim=True)", "mha", "rmsnorm_sum_squares"),
    ("return self.norm(x + self.proj(y))", "return self.norm(self.proj(y))", "mha", "no_residual"),
    ("turned = torch.stack([-tensor[..., 1::2], tensor[..., 0::2]]",
     "turned = torch.stack([tensor[..., 1::2], -tensor[..., 0::2]]", "rope", "rope_rotation_sign"),
    ("rot = torch.stack([-tensor[..., 1::2], tensor[..., 0::2]]",
     "rot = torch.stack([tensor[..., 1::2], -tensor[..., 0::2]]", "rope", "rope_rotation_sign"),
])
def test_each_encoder_sublayer_plant_fails(tmp_path, old, new, kind, name):
    result = check_file(edited_copy(tmp_path, HERE / "encoder_sublayers.py", [(old, new)]), only=[kind])
    assert_failed_at(result, name, new.strip())
    found = [f for c in result.components for f in c.findings if f.name == name]
    assert any(new.strip() in (f.code or "") for f in found), format_report(result)


def test_masks_named_keep_are_read_true_may_attend(tmp_path):
    """A mask argument named keep (True = may attend) is handed as a mask, never read as torch.nn's
    True = masked; a negation dropped or added FAILs as mask_inverted."""
    result = check_file(str(HERE / "keep_masks.py"), only=["mha"])
    assert statuses(result) == {"MultiHeadAttention": "pass", "Attention": "pass"}, format_report(result)
    for old, new in [("torch.where(keep, s,", "torch.where(~keep, s,"),
                     ("s.masked_fill(~keep_mask,", "s.masked_fill(keep_mask,")]:
        planted = check_file(edited_copy(tmp_path, HERE / "keep_masks.py", [(old, new)]), only=["mha"])
        assert_failed_at(planted, "mask_inverted", new)
