"""`handformer check` on model components written to conventions its reference learned to search: an
attention function that reads its head width from a module-level name (handed the width of its
inputs), and a language model whose caller builds the causal mask (PyTorch's language-model tutorial:
forward(src, src_mask)), handed that mask in the form that makes it causal, and an attention its block
hands the ALiBi term (MPT's forward(x, attn_bias)), handed ALiBi's, and an attention whose scores are
soft-capped (Gemma 2's cap * tanh(scores / cap)), the cap read from the module, and an encoder-decoder
whose sizes (vocabularies included) are module-level names and whose attention adds its own residual
and norm and requires its mask (not checked alone, never failed), and OPT's learned positions (a
table of max_len + 2 rows, position p at row p + 2), and a model that returns hidden states and holds
no output layer (a backbone: not checked, never failed). Each correct file passes; a planted mistake
fails, at its line where the localizer finds it."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy
from helpers import assert_failed_at

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_components"


# (file, the kind checked, the note its pass gives or "", the planted edit, the diagnosis named or "" where
# the FAIL quotes the planted line)
PLANTED = {
    "module_level_head_width": ("global_width_attention.py", "sdpa", "",
                                ("/ math.sqrt(HEAD_DIM)", "/ HEAD_DIM"), "scale_by_dk"),
    "causal_mask_from_its_caller": ("caller_mask_lm.py", "gpt", "",
                                    ("return self.out(self.ln_out(h))", "return self.out(h)"),
                                    "final_norm_missing"),
    "handed_alibi": ("handed_alibi.py", "causal_attention", "ALiBi inside",
                     ("math.sqrt(self.head_dim) + pos_bias", "math.sqrt(self.head_dim) - pos_bias"), ""),
    "soft_capped": ("capped_attention.py", "causal_attention", "soft-capped, 30 * tanh",
                    ("torch.tanh(logits / self.logit_cap) * self.logit_cap", "torch.tanh(logits) * self.logit_cap"),
                    ""),
}


@pytest.mark.parametrize("case", list(PLANTED))
def test_a_correct_component_passes_and_its_plant_fails(tmp_path, case):
    name, kind, note, (old, new), diagnosis = PLANTED[case]
    result = check_file(str(HERE / name), only=[kind])
    (component,) = result.components
    assert component.status == "pass", format_report(result)
    assert note in " ".join(n["en"] for n in component.notes)
    planted = edited_copy(tmp_path, HERE / name, [(old, new)])
    assert_failed_at(check_file(planted, only=[kind]), diagnosis, new)


def test_seq2seq_with_module_level_sizes_passes_and_its_plant_fails(tmp_path):
    result = check_file(str(HERE / "module_sized_seq2seq.py"), only=["transformer", "mha"])
    status = {c.name: c.status for c in result.components}
    # its attention adds a residual and a norm and requires its mask: handed every key visible to see
    # the norm, then checked with it taken out
    assert status == {"Seq2Seq": "pass", "MultiHeadAttention": "pass"}, format_report(result)
    planted = edited_copy(tmp_path, HERE / "module_sized_seq2seq.py", [(
        "self_hidden = pad_hidden(tgt, tgt) | future_hidden(tgt)", "self_hidden = pad_hidden(tgt, tgt)")])
    # (quoted where the decoder layers are handed that mask)
    assert_failed_at(check_file(planted, only=["transformer"]), "", "y = layer(y, x, self_hidden")


def test_learned_positions_from_row_two_pass_and_row_zero_fails(tmp_path):
    result = check_file(str(HERE / "offset_positions_lm.py"), only=["gpt"])
    (model,) = result.components
    assert model.status == "pass", format_report(result)
    assert any("row p + 2" in n["en"] for n in model.notes)
    planted = edited_copy(tmp_path, HERE / "offset_positions_lm.py", [(
        "rows = torch.arange(ids.size(1), device=ids.device) + FIRST_ROW",
        "rows = torch.arange(ids.size(1), device=ids.device)")])
    assert check_file(planted, only=["gpt"]).components[0].status == "fail"


def test_model_returning_hidden_states_without_a_head_is_not_failed(tmp_path):
    """A model with no output layer returns hidden states: a backbone, checked as the stack of its layers."""
    headless = edited_copy(tmp_path, HERE / "offset_positions_lm.py", [(
        "return self.norm(h) @ self.embed_tokens.weight.T  # tied head", "return self.norm(h)")])
    (model,) = check_file(headless, only=["gpt"]).components
    assert model.status == "pass" and "checked as the stack" in model.notes[-1]["en"], model


def test_a_mask_filled_with_torch_full_of_the_dtypes_minimum_passes(tmp_path):
    """torch.full((T, T), torch.finfo(x.dtype).min) with no dtype (float32 by default) is what a
    learner writes for float32 runs: check's float64 comparison keeps it float64 instead of failing
    the learner on float32 overflow."""
    written = edited_copy(tmp_path, HERE / "caller_mask_lm.py", [(
        "logits = logits.masked_fill(~keep, torch.finfo(logits.dtype).min)",
        "logits = logits + torch.full(keep.shape, torch.finfo(logits.dtype).min).masked_fill(keep, 0.0)")])
    result = check_file(written, only=["gpt"])
    (model,) = result.components
    assert model.status == "pass", format_report(result)
