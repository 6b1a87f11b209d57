"""Code that only a switch runs, and mistakes a file's own words tell (tests/fixtures/learners_switched/):

- lucidrains' style: an attention whose causal mask is a constructor switch off by default, and an FFN
  whose gated form is one, are checked again with the switch on (the decoder turns them on);
- MPT's style: a forward whose `is_causal` defaults to True is causal by what it says, so its own
  causal mask built the wrong way round, or heads merged without a transpose, are named; ALiBi's slopes
  from a head index that starts at 0 depart at that line;
- GPT-NeoX's parallel block: the normed stream added as the residual (a return's three-term sum), a
  norm factor kept as the head width, an exact GELU beside the file's own unused tanh GELU;
- Falcon's multi-query helper that returns q, k, v as slices of one fused tensor, k and v swapped there.

Each correct file passes whole; each plant FAILs, named, at its line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = Path(__file__).parent / "fixtures" / "learners_switched"

# (fixture, edits, the kinds checked, the mistake named, the planted line quoted)
PLANTS = {
    "no_self": ("correct.py", [(".triu(j - i + 1)", ".triu(j - i)")], ["mha", "causal_attention"],
                "causal_off_by_one", ".triu(j - i)"),
    "inverted": ("fused_causal.py", [("blocked = ~torch.ones(", "blocked = torch.ones(")], ["mha"],
                 "mask_inverted", "blocked = torch.ones("),
    "concat": ("fused_causal.py", [("return out.transpose(1, 2).reshape(b, t, -1)", "return out.reshape(b, t, -1)")],
               ["mha"], "concat_no_transpose", "return out.reshape(b, t, -1)"),
    "slopes": ("fused_causal.py", [("torch.arange(1, n_heads + 1,", "torch.arange(0, n_heads,")], ["alibi_slopes"],
               "departs", "torch.arange(0, n_heads,"),
    "residual": ("parallel_block.py", [
        ("normed = self.input_layernorm(hidden_states)", "hidden_states = self.input_layernorm(hidden_states)"),
        ("return self.attention(normed) + self.mlp(normed) + hidden_states",
         "return self.attention(hidden_states) + self.mlp(hidden_states) + hidden_states")], ["block"],
        "residual_from_normed", "hidden_states = self.input_layernorm(hidden_states)"),
    "scale": ("parallel_block.py", [("self.norm_factor = math.sqrt(self.head_size)", "self.norm_factor = self.head_size")],
              ["causal_attention"], "scale_by_dk", "self.norm_factor = self.head_size"),
    "kv_swapped": ("multiquery.py", [("return fused[..., :-2, :], fused[..., [-2], :], fused[..., [-1], :]",
                                      "return fused[..., :-2, :], fused[..., [-1], :], fused[..., [-2], :]")],
                   ["causal_attention"], "kv_swapped", "return fused[..., :-2, :], fused[..., [-1], :]"),
    "gelu": ("parallel_block.py", [("self.dense_4h_to_h(new_gelu(", "self.dense_4h_to_h(F.gelu(")], ["ffn"],
             "ffn_wrong_activation", "F.gelu(self.dense_h_to_4h(x))"),
}


@pytest.fixture(scope="module", params=["correct.py", "fused_causal.py", "parallel_block.py", "multiquery.py"])
def correct(request):
    return request.param, check_file(str(FOLDER / request.param))


def test_correct_files_pass_whole(correct):
    _, result = correct
    assert result.components and all(c.status == "pass" for c in result.components), format_report(result)


def test_a_switch_off_by_default_is_checked_on_too(correct):
    name, result = correct
    checked = {(c.kind, c.name) for c in result.components}
    expected = {"correct.py": {("mha", "SelfAttention"), ("causal_attention", "SelfAttention"),
                               ("ffn", "FeedForward"), ("ffn", "FeedForward(gated=True)")},
                "fused_causal.py": {("mha", "MultiheadAttention"), ("alibi_slopes", "alibi_slopes")}}
    assert expected.get(name, set()) <= checked, format_report(result)


@pytest.mark.parametrize("plant", list(PLANTS))
def test_each_plant_fails_named_at_its_line(tmp_path, plant):
    source, edits, kinds, name, line = PLANTS[plant]
    result = check_file(edited_copy(tmp_path, FOLDER / source, edits), only=kinds)
    found = [(f.name, f.code or "") for c in result.components if c.status == "fail" for f in c.findings]
    assert any(n == name and line in code for n, code in found), format_report(result)
