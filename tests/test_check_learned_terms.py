"""A learned term check did not map is no evidence (core/unmapped.py: term_words).

A linear layer of a block or model that no role of the reference took (a gate a head on the attention's
output, a router that picks the tokens a block processes) feeds what it computes: an unnamed departure
is NOT CHECKED, naming the layer and the line that reads it, never FAIL. A catalogued mistake still
FAILs: in a part checked on its own (an FFN with no activation, the scores divided by d_k), and in the
block that uses that part (the part's name is its evidence, though the block departs by its gate too).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import assert_failed_at, component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_learned_terms"
FILES = {"gated_block.py": ["block", "gpt"], "gated_block_no_activation.py": ["ffn", "block"],
         "routed_block.py": ["block", "gpt"], "routed_block_scale_by_dk.py": ["causal_attention"]}
# (the parts NOT CHECKED by their learned term, the term as said); a routed model's blocks are not all
# alike (every other one routed): NOT CHECKED at the model for that first (test_model_of_routed_blocks)
TERMS = {"gated_block.py": ("GatedBlock", "GatedLM", "wg (4, 16), read at line 34"),
         "routed_block.py": ("RoutedBlock", "router (1, 16), read at line 63")}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(FIXTURES / name), only=kinds) for name, kinds in FILES.items()}


@pytest.mark.parametrize("name", TERMS)
def test_an_unmapped_learned_term_makes_a_departure_not_checked(results, name):
    *parts, said = TERMS[name]
    for part in parts:
        c = component(results[name], part)
        assert c.status == "not_checked", format_report(results[name])
        assert "computes a learned term with" in c.error.message and said in c.error.message
        assert "可学习的项" in c.error.message_zh and not c.findings


def test_a_model_of_routed_and_plain_blocks_is_not_compared_whole(results):
    c = component(results["routed_block.py"], "RoutedGPT")
    assert c.status == "not_checked" and "its blocks are not all alike" in c.error.message, c.error
    assert "h.1.inner" in c.error.message and not c.findings


def test_a_catalogued_mistake_beside_a_learned_term_still_fails(results):
    gated = results["gated_block_no_activation.py"]
    block = component(gated, "GatedBlock")
    assert block.status == "fail" and "ffn_no_activation" in {f.name for f in block.findings}, format_report(gated)
    assert_failed_at(results["routed_block_scale_by_dk.py"], "scale_by_dk", "")
