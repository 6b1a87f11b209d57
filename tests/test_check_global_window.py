"""Longformer's attention (a window of w tokens on each side, global tokens that see and are seen by
every token, marked by a global_attention_mask) in two styles: a boolean mask built with abs() in an
attention module, and an additive mask built in a loop inside a post-norm encoder layer. Both pass with
every component checked (graded as a full attention with every token global, then the window read off
their output and the global tokens compared with the dense masked attention); each plant fails at its
line."""

from __future__ import annotations

import inspect

import pytest
from check_results import checked, named, statuses

from handformer.check.core.global_window import global_names

FILES = {("learners_longformer", "correct"), ("learners_longformer", "global_one_way"),
         ("learners_longformer", "window_one_sided"), ("learners_longformer_layer", "correct"),
         ("learners_longformer_layer", "global_queries_wrong")}


@pytest.fixture(scope="module")
def results():
    return {key: checked(*key) for key in FILES}


@pytest.mark.parametrize("folder", ["learners_longformer", "learners_longformer_layer"])
def test_a_correct_longformer_attention_passes_with_its_window_and_global_tokens_checked(results, folder):
    result = results[folder, "correct"]
    assert set(statuses(result).values()) == {"pass"}
    for comp in result.components:
        checks = " ".join(c.name["en"] for c in comp.checks)
        assert "global tokens (positions 0, and 0 and 7) see every token" in checks, comp.name


@pytest.mark.parametrize(("key", "comp", "line"), [
    (("learners_longformer", "global_one_way"), "LongformerSelfAttention",
     "return local[None] | is_global[:, None, :]"),
    (("learners_longformer", "window_one_sided"), "LongformerSelfAttention",
     "local = pos[:, None] - pos[None, :] <= window"),
    (("learners_longformer_layer", "global_queries_wrong"), "WindowedSelfAttention",
     "bias = bias.masked_fill(g[:, None, None, :], 0.0)  # global queries see everything"),
    (("learners_longformer_layer", "global_queries_wrong"), "LongformerLayer",
     "bias = bias.masked_fill(g[:, None, None, :], 0.0)  # global queries see everything"),
])
def test_each_plant_fails_at_its_line(results, key, comp, line):
    result = results[key]
    assert statuses(result)[comp] == "fail"
    assert any(line in (code or "") for _, code in named(result, comp)), named(result, comp)


def test_only_a_mask_of_global_tokens_is_handed_one_not_a_list_of_their_positions():
    def forward(x, global_attention_mask=None, global_positions=None, is_global_mask=None):
        return x

    params = list(inspect.signature(forward).parameters.values())
    assert global_names(params) == ["global_attention_mask", "is_global_mask"]
