"""Attention whose scores keep the queries first, (B, T, H, S), takes its mask as (B, T, 1, S)
(GPT-BigCode's layout, core/conventions.py QUERY_FIRST), tried where the code raises on every
usual layout: where_bool.py a multi-query attention reading a bool mask with torch.where, its key
and value projections one head wide, (Dh, D), read from their shapes (core/weights.py,
narrow_kv_width); additive.py an attention adding a float mask. The attention, the block and the
model pass, and the report names the layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_query_first_mask"
KINDS = ["mha", "block", "gpt"]


@pytest.fixture(scope="module")
def results():
    out = {}
    for name in ("where_bool.py", "additive.py"):
        result = check_file(str(HERE / name), only=KINDS)
        out[name] = ({c.kind: c.status for c in result.components}, format_report(result))
    return out


@pytest.mark.parametrize("name, convention", [("where_bool.py", "bool, True = keep, query-first"),
                                              ("additive.py", "0 = keep, -1e9 = masked, query-first")])
def test_a_query_first_mask_is_handed_so(results, name, convention):
    status, report = results[name]
    assert status == dict.fromkeys(KINDS, "pass"), report
    assert convention in report, report


def test_one_head_key_and_value_projections_read_as_multi_query(results):
    assert "grouped-query attention (4 heads, 1 key/value heads)" in results["where_bool.py"][1]
