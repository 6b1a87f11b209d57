"""A rotary function whose q and k come out with their head dims reordered alike (interleaved pairs
regrouped into halves before a half-split rotation: DeepSeek's checkpoints) leaves every score q.k
unchanged: a convention (DIFFERS), in two forms (a view and transpose; a gather by a cached index).
The same reorder on q alone, or the rotation turned the other way, still FAILs."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_reordered_rope"
CORRECT = ("view_transpose", "index_order")
PLANTED = {"view_transpose_keys_unordered": "line 15", "index_order_queries_only": "line 18",
           "view_transpose_turned_back": "line 10: return torch.cat((x2, -x1), dim=-1)"}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=["rope"]) for name in (*CORRECT, *PLANTED)}


@pytest.mark.parametrize("name", CORRECT)
def test_a_shared_reorder_of_the_head_dims_is_a_convention(results, name):
    (comp,) = results[name].components
    assert comp.status == "differs", format_report(results[name])
    assert "reordered alike in queries and keys" in comp.convention["en"]
    assert "同一顺序重排" in comp.convention["zh"]


@pytest.mark.parametrize("name", PLANTED)
def test_a_reorder_of_one_side_or_a_turned_rotation_fails(results, name):
    (comp,) = results[name].components
    assert comp.status == "fail" and PLANTED[name] in format_report(results[name]), format_report(results[name])


def test_the_turned_rotation_is_named(results):
    (comp,) = results["view_transpose_turned_back"].components
    assert [f.name for f in comp.findings] == ["rope_rotation_sign"]
