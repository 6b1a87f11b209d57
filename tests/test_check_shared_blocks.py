"""Correct files that `handformer check` once failed for what it assumed, not for what they compute, and
a plant in each that must still fail:

- a PaLM-flavoured decoder with multi-query attention: its config names one key/value head and its
  fused projection is split as the queries, one key and one value, so it raises built with more; it is
  checked with one (grouping.py), noted;
- a looped GPT-2 that runs its stack of blocks several times: the reference is run through the same
  sequence of its blocks (block_order.py); a loop that leaves a block out still fails;
- an encoder layer whose bool padding mask is True = hidden, filled by the functional
  torch.masked_fill(scores, mask, value), read as torch.nn's convention; the same file written with
  torch.where(mask, scores, min), True = keep, read the other way;
- a block whose fused projection its comment states as [q | v | k] (CodeGen's shards are so): its rows
  read in that order; split as q, k, v there, kv_swapped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
PALM = FIXTURES / "learners_palm_mqa" / "correct.py"
LOOPED = FIXTURES / "learners_looped_gpt" / "correct.py"
HIDE = FIXTURES / "learners_hide_mask" / "correct.py"
VALUE_FIRST = FIXTURES / "learners_value_first" / "correct.py"
FILL = "            scores = torch.masked_fill(scores, pad_mask, torch.finfo(scores.dtype).min)\n"


def statuses(result):
    return {c.name: c.status for c in result.components}


def component(result, name):
    return next(c for c in result.components if c.name == name)


@pytest.fixture(scope="module")
def palm():
    return check_file(str(PALM))


@pytest.fixture(scope="module")
def palm_unscaled(tmp_path_factory):
    return check_file(edited_copy(tmp_path_factory.mktemp("unscaled"), PALM, [(
        "scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)", "scores = q @ k.transpose(-2, -1)")]),
        only=["causal_attention"])


@pytest.fixture(scope="module")
def looped():
    return check_file(str(LOOPED))


@pytest.fixture(scope="module")
def looped_short(tmp_path_factory):
    """The loop leaves the last block out."""
    return check_file(edited_copy(tmp_path_factory.mktemp("short"), LOOPED, [(
        "            for block in self.h:", "            for block in self.h[:-1]:")]), only=["gpt"])


@pytest.fixture(scope="module")
def looped_gainless(tmp_path_factory):
    """A final norm without gains: its leaf names no module path."""
    return check_file(edited_copy(tmp_path_factory.mktemp("gainless"), LOOPED, [(
        "self.ln_f = nn.LayerNorm(n_embd)", "self.ln_f = nn.LayerNorm(n_embd, elementwise_affine=False)")]),
        only=["gpt"])


@pytest.fixture(scope="module")
def hide():
    return check_file(str(HIDE))


@pytest.fixture(scope="module")
def keep(tmp_path_factory):
    return check_file(edited_copy(tmp_path_factory.mktemp("keep"), HIDE, [(
        FILL, "            scores = torch.where(pad_mask, scores, torch.finfo(scores.dtype).min)\n")]))


@pytest.fixture(scope="module")
def hide_wrong_axis(tmp_path_factory):
    return check_file(edited_copy(tmp_path_factory.mktemp("axis"), HIDE, [(
        "weights = scores.softmax(dim=-1)", "weights = scores.softmax(dim=-2)")]), only=["mha"])


def test_multi_query_attention_split_for_one_key_head_passes_noted(palm):
    assert set(statuses(palm).values()) == {"pass"}, format_report(palm)
    assert any("multi-query" in n["en"] for n in component(palm, "MultiQueryAttention").notes)


def test_multi_query_attention_without_its_scale_fails_at_its_line(palm_unscaled):
    found = [(f.name, f.code) for f in component(palm_unscaled, "MultiQueryAttention").findings]
    assert ("no_scaling", "scores = q @ k.transpose(-2, -1)  # (B, H, T, T)") in found, format_report(palm_unscaled)


def test_a_model_that_loops_over_its_blocks_passes_noted(looped):
    assert set(statuses(looped).values()) == {"pass"}, format_report(looped)
    assert any("in the order 0, 1, 0, 1, 0, 1" in n["en"] for n in component(looped, "LoopedGPT").notes)


def test_a_looped_model_with_a_gainless_final_norm_passes(looped_gainless):
    assert statuses(looped_gainless) == {"LoopedGPT": "pass"}, format_report(looped_gainless)


def test_a_loop_that_leaves_a_block_out_fails(looped_short):
    assert statuses(looped_short)["LoopedGPT"] == "fail", format_report(looped_short)


@pytest.mark.parametrize("name", ["hide", "keep"])
def test_a_bool_padding_mask_read_as_the_code_fills_it(name, request):
    result = request.getfixturevalue(name)
    assert set(statuses(result).values()) == {"pass"}, format_report(result)
    said = component(result, "SelfAttention").convention["en"]
    assert ("True = masked" in said) == (name == "hide"), said


def test_a_plant_beside_a_mask_that_hides_where_true_fails(hide_wrong_axis):
    assert statuses(hide_wrong_axis)["SelfAttention"] == "fail", format_report(hide_wrong_axis)
    assert "softmax_wrong_dim" in [f.name for f in component(hide_wrong_axis, "SelfAttention").findings]


@pytest.fixture(scope="module")
def value_first():
    return check_file(str(VALUE_FIRST))


@pytest.fixture(scope="module")
def value_first_swapped(tmp_path_factory):
    return check_file(edited_copy(tmp_path_factory.mktemp("swapped"), VALUE_FIRST, [(
        "q, v, k = self.qvk(x).chunk(3, dim=-1)", "q, k, v = self.qvk(x).chunk(3, dim=-1)")]),
        only=["causal_attention"])


def test_a_fused_projection_stated_as_q_v_k_is_read_so(value_first):
    assert set(statuses(value_first).values()) == {"pass"}, format_report(value_first)
    assert "qvk[v of [q | v | k]] -> W_V" in component(value_first, "FusedCausalAttention").mapping


def test_split_against_its_stated_order_is_kv_swapped_at_the_split(value_first_swapped):
    found = [(f.name, f.code) for f in component(value_first_swapped, "FusedCausalAttention").findings]
    assert found == [("kv_swapped", "q, k, v = self.qvk(x).chunk(3, dim=-1)")], format_report(value_first_swapped)
