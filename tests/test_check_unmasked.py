"""Layers and attentions that take no mask or take their inputs by keyword, each with a plant that
fails quoting its line and its correct twin: a ViT-style block whose forward takes no mask (an encoder
layer where every token sees every other; the mask is not graded), and labml's sequence-first style
(keyword-only inputs, masks [seq_q, seq_k, batch], a projection-into-heads class that is no attention)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_unmasked"
PATCH_SHARED = ("x = x + self.mlp(self.ln_b(x))", "x = x + self.mlp(self.ln_a(x))")


@pytest.mark.parametrize("planted", [False, True])
def test_a_block_that_takes_no_mask_is_an_encoder_layer_graded_for_what_it_computes(tmp_path, planted):
    path = edited_copy(tmp_path, HERE / "patch_block.py", [PATCH_SHARED] * planted)
    result = check_file(path, only=["encoder_layer"])
    (block,) = result.components
    report = format_report(result)
    assert block.name == "PatchBlock" and any("takes no mask" in n["en"] for n in block.notes), report
    assert block.status == ("fail" if planted else "differs"), report  # pre-norm: the paper's is post-norm
    if planted:
        assert "shared_norm" in [f.name for f in block.named()], report
        assert f"{PATCH_SHARED[1]}" in report, report


SOFTMAX_OVER_QUERIES = ("probs = scores.softmax(dim=1)", "probs = scores.softmax(dim=0)")


@pytest.mark.parametrize("planted", [False, True])
def test_sequence_first_keyword_only_attention_and_layer_are_checked(tmp_path, planted):
    path = edited_copy(tmp_path, HERE / "seq_first_keywords.py", [SOFTMAX_OVER_QUERIES] * planted)
    result = check_file(path, only=["mha", "block"])
    report = format_report(result)
    statuses = {c.name: c.status for c in result.components}
    assert statuses == {"SeqFirstAttention": "fail" if planted else "pass",
                        "SeqFirstLayer": "fail" if planted else "pass"}, report
    attention = result.components[0]
    assert "(T, S, B)" in attention.convention["en"], report
    if planted:
        assert [f.name for f in attention.named()] == ["softmax_wrong_dim"], report
        assert SOFTMAX_OVER_QUERIES[1] in report, report


def test_a_zero_initialized_square_projection_is_read_as_nn_linear():
    """modded-nanogpt's CastedLinear (F.linear(x, weight)) zero-initialized reads the same stored either
    way: it keeps nn.Linear's (out, in) reading; Conv1D's x @ weight (in, out) is still read transposed."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from handformer.check.core.weights import untranspose_

    class Casted(nn.Linear):
        def forward(self, x):
            return F.linear(x, self.weight.type_as(x))

    class Conv1D(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(16, 16))

        def forward(self, x):
            return x @ self.weight

    zero = Casted(16, 16, bias=False)
    nn.init.zeros_(zero.weight)
    assert untranspose_(nn.ModuleDict({"proj": zero})) == []
    assert untranspose_(nn.ModuleDict({"c_proj": Conv1D()})) == ["c_proj"]
