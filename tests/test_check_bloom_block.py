"""`handformer check` on a BLOOM-style block: the model hands every block ALiBi's term (`block(x, alibi,
mask)`, the mask required) and the attention and the MLP each take the residual they add
(`mlp(x, residual)`). The MLP is driven with the residual handed zero, the block with check's ALiBi
term at its own head count, the layout of its fused projection read on one token with its mask
handed; each passes, and a plant in each fails. The model on such blocks is NOT CHECKED with that
reason: the model is not compared, its parts are."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_bloom_block"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module")
def no_gelu():
    return check_file(str(HERE / "mlp_no_gelu.py"), only=["ffn"])


@pytest.fixture(scope="module")
def from_normed():
    return check_file(str(HERE / "residual_from_normed.py"), only=["block"])


def test_the_mlp_and_block_handed_residual_and_alibi_are_checked_and_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"BloomAttention": "pass", "alibi_slopes": "pass", "BloomMLP": "pass", "BloomBlock": "pass",
                      "BloomForCausalLM": "not_checked"}, format_report(correct)


def test_the_model_on_alibi_blocks_is_not_checked_with_that_reason(correct):
    model = next(c for c in correct.components if c.name == "BloomForCausalLM")
    assert "its blocks are handed ALiBi's term" in model.error.message, model.error.message


def test_an_mlp_without_its_activation_fails(no_gelu):
    (mlp,) = no_gelu.components
    assert mlp.status == "fail" and [f.name for f in mlp.findings] == ["ffn_no_activation"], format_report(no_gelu)


def test_a_block_whose_mlp_residual_is_the_normed_input_fails(from_normed):
    (block,) = from_normed.components
    assert block.status == "fail", format_report(from_normed)
    assert [f.name for f in block.findings] == ["residual_from_normed"]
