"""Styles of learners17's families, each with a plant that fails quoting its line and its correct twin:
a ViT-style block whose forward takes no mask (an encoder layer where every token sees every other; the
mask is not graded), labml's sequence-first style (keyword-only inputs, masks [seq_q, seq_k, batch], a
projection-into-heads class that is no attention), a zero-initialized square projection (modded-nanogpt's
CastedLinear), and a sampling loop whose top-k keeps no token at top_k=1."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_more_styles"
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


CAUSAL_NO_WORD = ("        weights = torch.softmax(q @ k.transpose(-1, -2) / self.d_head ** 0.5, dim=-1)",
                  "        logits = q @ k.transpose(-1, -2) / self.d_head ** 0.5\n"
                  "        hidden = torch.arange(n)[:, None] < torch.arange(n)  # key after query\n"
                  "        weights = torch.softmax(logits.masked_fill(hidden, float('-inf')), dim=-1)")


def test_a_block_that_takes_no_mask_and_runs_causal_is_a_decoder_only_block(tmp_path):
    """No word of the file says causal, yet the block is causal as it runs: it is no encoder layer."""
    result = check_file(edited_copy(tmp_path, HERE / "patch_block.py", [CAUSAL_NO_WORD]), only=["encoder_layer"])
    (block,) = result.components
    assert (block.kind, block.status) == ("block", "pass"), format_report(result)


SEQ_FIRST_PLANTS = {  # name -> (edit, the line quoted)
    "correct": (None, None),
    "softmax_wrong_dim": (("self.attend = nn.Softmax(dim=1)", "self.attend = nn.Softmax(dim=0)"),
                          "line 30: self.attend = nn.Softmax(dim=0)"),
    "shared_norm": (("h = self.ffn_norm(x)", "h = self.attn_norm(x)"), "line 68: h = self.attn_norm(x)"),
}


@pytest.mark.parametrize("plant", list(SEQ_FIRST_PLANTS))
def test_sequence_first_keyword_only_attention_and_layer_are_checked(tmp_path, plant):
    """A softmax written as a module (nn.Softmax(dim=0)) is quoted at its line, not at the raw docstring
    that speaks of the softmax; a norm called a second time is where one norm serves two sublayers."""
    edit, line = SEQ_FIRST_PLANTS[plant]
    path = edited_copy(tmp_path, HERE / "seq_first_keywords.py", [edit] if edit else [])
    result = check_file(path, only=["mha", "block"])
    report = format_report(result)
    failing = {"softmax_wrong_dim": {"SeqFirstAttention", "SeqFirstLayer"}, "shared_norm": {"SeqFirstLayer"}}
    statuses = {c.name: c.status for c in result.components}
    assert statuses == {name: "fail" if name in failing.get(plant, ()) else "pass"
                        for name in ("SeqFirstAttention", "SeqFirstLayer")}, report
    assert "(T, S, B)" in result.components[0].convention["en"], report
    for comp in result.components:
        assert [f.name for f in comp.named()] == [plant] * (comp.name in failing.get(plant, ())), report
    assert line is None or line in report, report


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


TOP_K_KEEPS_NONE = ("logits < kth", "logits <= kth")


@pytest.mark.parametrize("planted", [False, True])
def test_a_loop_whose_top_k_keeps_no_token_at_k_1_is_top_k_off_by_one(tmp_path, planted):
    path = edited_copy(tmp_path, HERE / "topk_loop.py", [TOP_K_KEEPS_NONE] * planted)
    result = check_file(path, only=["generate"])
    (loop,) = result.components
    report = format_report(result)
    assert loop.status == ("fail" if planted else "pass"), report
    assert [(f.name, f.line) for f in loop.named()] == ([("top_k_off_by_one", 14)] if planted else []), report


SIZE_PLANTS = {  # a size read under another's name is quoted where it is read; one used wrongly, where used
    "misread": (("head_dim = query.size(-1)", "head_dim = query.size(-2)"), 8),
    "misused": (("/ math.sqrt(head_dim)", "/ math.sqrt(length)"), 10),
}


@pytest.mark.parametrize("plant", list(SIZE_PLANTS))
def test_a_size_read_wrong_is_quoted_where_it_is_read(tmp_path, plant):
    edit, line = SIZE_PLANTS[plant]
    result = check_file(edited_copy(tmp_path, HERE / "scaled_scores.py", [edit]), only=["sdpa"])
    (sdpa,) = result.components
    assert sdpa.status == "fail" and [(f.name, f.line) for f in sdpa.findings] == [("departs", line)], (
        format_report(result))


@pytest.mark.parametrize(("old", "new", "failing"), [
    (None, None, None),
    ("x.pow(2).mean(-1, keepdim=True) + self.eps", "x.pow(2).mean(-1, keepdim=True)", "RMSNorm"),
    ("x1 * sin + x2 * cos]", "x2 * cos - x1 * sin]", "RoPE"),
])
def test_pieces_built_from_mlx_dims_are_checked(tmp_path, old, new, failing):
    """MLX's constructor argument `dims` (nn.RMSNorm(dims), nn.RoPE(dims, traditional, base)) is the
    width: both are built and graded, and a planted line fails its piece."""
    path = edited_copy(tmp_path, HERE / "mlx_pieces.py", [(old, new)] if old else [])
    result = check_file(path)
    status = {c.name: c.status for c in result.components}
    assert status == {"RMSNorm": "pass", "RoPE": "pass"} | ({failing: "fail"} if failing else {}), \
        format_report(result)
