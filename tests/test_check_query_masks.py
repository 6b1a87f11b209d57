"""`handformer check` on mask helpers that take the number of queries beside the padding (Hugging Face's
build_4d_mask(attention_mask, q_len) for batched decoding with left padding): handed the ids' length,
graded as the causal (target) mask where its rows differ a query, as a padding mask where every query
gets the same row. Two forms: a (B, S) padding mask in, bool True = keep out; token ids and a pad id
in, an additive mask out (beside a padding-only helper of the same arguments, which passes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY = Path(__file__).parent / "fixtures" / "learners_query_masks"
TARGET = "the target mask hides what the attention must not see"
SOURCE = "the source mask hides what the attention must not see"


@pytest.fixture(scope="module", params=[("keep_rows", [TARGET]), ("padded_ids", [SOURCE, TARGET])])
def correct(request):
    file, checks = request.param
    return check_file(str(FAMILY / f"{file}.py"), only=["mask_helper"]), checks


@pytest.fixture(scope="module", params=[
    ("keep_rows_or", "mask_combined_with_or", 11, "return real | ~future"),
    ("padded_ids_no_self", "causal_off_by_one", 16, "diagonal=-1")])
def planted(request):
    file, name, line, code = request.param
    return check_file(str(FAMILY / f"{file}.py"), only=["mask_helper"]), name, line, code


def test_a_mask_helper_given_the_query_count_passes_as_the_mask_it_makes(correct):
    result, checks = correct
    assert {c.status for c in result.components} == {"pass"}, format_report(result)
    assert [c.checks[0].name["en"].split(" (")[0] for c in result.components] == checks


def test_a_planted_mask_helper_given_the_query_count_fails_named_at_its_line(planted):
    result, name, line, code = planted
    helper = result.components[-1]
    assert helper.status == "fail", format_report(result)
    assert [(f.name, f.line) for f in helper.findings] == [(name, line)]
    assert code in helper.findings[0].code
