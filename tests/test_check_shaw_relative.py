"""`check` on Shaw et al.'s relative-position attention (e_ij = q_i (k_j + a_ij^K)^T / sqrt(d), the
distance j - i clipped to [-k, k]) in a Chinese positional-encoding exercise, two ways
(tests/fixtures/learners_shaw_relative/): tables held as parameters, added to keys and values; an
nn.Embedding added to the keys alone, inside a post-norm encoder layer. handformer has no such term:
the attention and its layer are NOT CHECKED with the tables named, never FAIL."""

from __future__ import annotations

import pytest
from check_results import checked, component, statuses

from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def runs():
    return {name: checked("learners_shaw_relative", name) for name in ("correct", "embedding_keys")}


def test_tables_added_to_keys_and_values_are_named_not_failed(runs):
    result = runs["correct"]
    assert statuses(result) == {"RelativeMultiHeadAttention": "not_checked"}, format_report(result)
    why = component(result, "RelativeMultiHeadAttention").error.message
    assert "relative-position tables (rel_k (9, 4), rel_v (9, 4))" in why and "Shaw" in why


def test_an_embedding_on_the_keys_leaves_attention_and_layer_not_checked(runs):
    result = runs["embedding_keys"]
    assert statuses(result) == {"RelativeSelfAttention": "not_checked", "EncoderLayer": "not_checked"}, (
        format_report(result))
    assert "self_attn.rel_pos_k (7, 4)" in component(result, "EncoderLayer").error.message
