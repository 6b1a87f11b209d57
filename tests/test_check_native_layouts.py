"""`handformer check` on code written in another library's own layout, each a correct file that
passes and a planted one-line mistake that fails: filters of one 1-D row of logits (llama.cpp's
sampler chain, and one that runs on a batch but mixes its rows beside them), fairseq's sequence-first attention with torch.nn's key_padding_mask, Flax's
(B, T, H, Dh) attention, and the Annotated Transformer's training step with its own batch class and
loss-compute wrapper."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy
from helpers import assert_failed_at, statuses

from handformer.check.core.conventions import masks_where_true
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_native"


def test_filters_of_one_row_are_called_row_by_row_and_min_p_is_told_from_top_p(tmp_path):
    result = check_file(str(HERE / "one_row_filters.py"))
    assert statuses(result) == {"keep_top_k": "pass", "nucleus_cut": "pass", "min_p_cut": "pass"}, \
        format_report(result)
    assert {c.kind for c in result.components} == {"top_k", "top_p", "min_p"}
    off = edited_copy(tmp_path, HERE / "one_row_filters.py", [("scores < cutoff", "scores <= cutoff")])
    assert_failed_at(check_file(off, only=["top_k"]), "top_k_off_by_one", "scores <= cutoff")


def test_a_filter_of_one_row_that_runs_on_a_batch_is_called_row_by_row_beside_filters_of_one_row(tmp_path):
    result = check_file(str(HERE / "position_filters.py"))
    assert statuses(result) == {"truncate_top_k": "pass", "truncate_min_p": "pass"}, format_report(result)
    assert {c.kind for c in result.components} == {"top_k", "min_p"}
    plain = edited_copy(tmp_path, HERE / "position_filters.py", [("floor = p * prob.max()", "floor = p")])
    planted = check_file(plain, only=["min_p"])
    assert_failed_at(planted, "min_p_not_scaled", "")
    assert [f.code for c in planted.components for f in c.findings] == ["floor = p"], format_report(planted)
    # beside a top-k that takes a batch, a min-p mixing the rows of a batch is a batched filter's mistake
    batched = edited_copy(tmp_path, HERE / "position_filters.py", [
        ("torch.topk(x, top_k).values[top_k - 1]", "torch.topk(x, top_k).values[..., -1:]")])
    assert statuses(check_file(batched)) == {"truncate_top_k": "pass", "truncate_min_p": "fail"}


def test_a_key_padding_mask_reshaped_before_masked_fill_is_read_as_torch_nn_reads_it(tmp_path):
    assert masks_where_true("s.masked_fill(key_padding_mask.view(B, 1, 1, T).to(torch.bool), -inf)",
                            "key_padding_mask")
    assert not masks_where_true("s.masked_fill(~key_padding_mask.unsqueeze(1), -inf)", "key_padding_mask")
    result = check_file(str(HERE / "time_first_attention.py"), only=["mha"])
    assert statuses(result) == {"SelfAttention": "pass"}, format_report(result)
    scale = edited_copy(tmp_path, HERE / "time_first_attention.py", [("self.dh ** -0.5", "self.dh ** -1")])
    assert_failed_at(check_file(scale, only=["mha"]), "scale_by_dk", "")


def test_attention_in_flax_layout_is_driven_so(tmp_path):
    result = check_file(str(HERE / "heads_last_attention.py"), overrides={"sdpa": "attend"})
    assert statuses(result) == {"attend": "pass"}, format_report(result)
    wrong = edited_copy(tmp_path, HERE / "heads_last_attention.py", [("softmax(logits, dim=-1)",
                                                                      "softmax(logits, dim=-2)")])
    assert_failed_at(check_file(wrong, overrides={"sdpa": "attend"}), "softmax_wrong_dim", "dim=-2")


def test_a_step_with_its_own_batch_class_and_loss_compute_passes(tmp_path):
    result = check_file(str(HERE / "annotated_step.py"))
    assert statuses(result) == {"training_step": "pass"}, format_report(result)
    pads = edited_copy(tmp_path, HERE / "annotated_step.py", [("(self.trg_y != pad_idx).sum()",
                                                               "self.trg_y.numel()")])
    assert statuses(check_file(pads)) == {"training_step": "fail"}


def test_a_stack_mapping_vectors_to_vectors_is_no_gpt_to_drive_but_a_stack():
    result = check_file(str(HERE / "vector_stack.py"), overrides={"gpt": "Transformer"}, only=["gpt"])
    model = next(c for c in result.components if c.name == "Transformer")
    assert model.status == "pass" and "checked as the stack" in model.notes[-1]["en"], format_report(result)


def test_a_backbone_another_class_builds_is_checked_as_a_stack():
    result = check_file(str(HERE / "vector_stack.py"), overrides={"gpt": "Backbone"}, only=["gpt"])
    model = next(c for c in result.components if c.name == "Backbone")
    assert model.status == "pass" and "a backbone" in model.notes[-1]["en"], format_report(result)
