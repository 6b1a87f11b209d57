"""A mask's convention read where the attention's forward hands its mask to a method of its own under
another name (Megatron's `scale_mask_softmax(scores, mask)`): bool True = masked filled with -10000, or
1 = masked times -1e9 added; each passes as written. A file whose own causal mask says True = may see
while its attention fills where True still FAILs mask_inverted at the attention's line."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import component

from handformer.check.core.engine import check_file

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_mask_methods"


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(FIXTURES / f"{name}.py"), only=["causal_mask", "mha"])
            for name in ("masked_true", "added_ones", "inverted")}


@pytest.mark.parametrize("name", ["masked_true", "added_ones"])
def test_a_mask_handed_to_a_method_is_read_in_the_methods_convention(results, name):
    c = component(results[name], "SelfAttention")
    assert c.status == "pass" and not c.findings, (c.findings, c.error)
    assert "True = masked" in c.convention["en"]


def test_an_attention_that_disagrees_with_its_files_mask_still_fails_inverted(results):
    c = component(results["inverted"], "SelfAttention")
    assert c.status == "fail" and [(f.name, f.line) for f in c.findings] == [("mask_inverted", 27)], c.findings
