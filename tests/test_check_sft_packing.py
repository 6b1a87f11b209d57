"""Masks of packed SFT rows in two forms (tests/fixtures/learners_sft_packing/): a document-causal
mask from each token's document id (its docstring speaks of padding, so its padding rule is not read as
a source mask's), and one from position ids that restart at each document. Each is a causal mask
function handed one document (the causal mask) and then two packed documents of 3 and 2 tokens (each
query sees its own document up to itself); a mask that lets a query see another document FAILs."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_sft_packing"
PLANTED = ("no_document", "positions_earlier_docs")


@pytest.fixture(scope="module")
def checked():
    return {name: check_file(str(HERE / f"{name}.py")) for name in ("correct", "positions", *PLANTED)}


@pytest.mark.parametrize("name", ["correct", "positions"])
def test_a_document_causal_mask_passes_both_checks(checked, name):
    result = checked[name]
    (mask,) = result.components
    assert mask.kind == "causal_mask" and mask.status == "pass", format_report(result)
    assert any("packed documents" in str(c.name) and c.ok for c in mask.checks), format_report(result)


@pytest.mark.parametrize("name", PLANTED)
def test_a_mask_that_crosses_documents_fails(checked, name):
    result = checked[name]
    (mask,) = result.components
    assert mask.status == "fail", format_report(result)
    assert [c.ok for c in mask.checks if "packed documents" in str(c.name)] == [False], format_report(result)
