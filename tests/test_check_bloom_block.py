"""`handformer check` on a BLOOM-style block: the model hands every block ALiBi's term (`block(x, alibi,
mask)`, the mask required) and the attention and the MLP each take the residual they add
(`mlp(x, residual)`). The MLP is driven with the residual handed zero, the block with check's ALiBi
term at its own head count, the layout of its fused projection read on one token with its mask
handed; each passes, and a plant in each fails. The model on such blocks is compared with handformer's
CausalLM with ALiBi, its embedding LayerNorm (defined before the blocks, the final one after them)
applied to the embeddings; a model that builds that norm and never applies it fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_bloom_block"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module")
def unnormed(tmp_path_factory):
    """The embedding LayerNorm built, never applied."""
    return check_file(edited_copy(tmp_path_factory.mktemp("unnormed"), HERE / "correct.py", [(
        "x = self.word_embeddings_layernorm(self.word_embeddings(input_ids))",
        "x = self.word_embeddings(input_ids)")]), only=["gpt"])


@pytest.fixture(scope="module")
def no_gelu():
    return check_file(str(HERE / "mlp_no_gelu.py"), only=["ffn"])


@pytest.fixture(scope="module")
def from_normed():
    return check_file(str(HERE / "residual_from_normed.py"), only=["block"])


def test_the_mlp_block_and_model_handed_residual_and_alibi_are_checked_and_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"BloomAttention": "pass", "alibi_slopes": "pass", "BloomMLP": "pass", "BloomBlock": "pass",
                      "BloomForCausalLM": "pass"}, format_report(correct)
    model = next(c for c in correct.components if c.name == "BloomForCausalLM")
    assert "word_embeddings_layernorm -> embedding norm" in model.mapping[1], model.mapping


def test_a_model_that_never_applies_its_embedding_norm_fails(unnormed):
    (model,) = unnormed.components
    assert model.status == "fail", format_report(unnormed)


def test_an_mlp_without_its_activation_fails(no_gelu):
    (mlp,) = no_gelu.components
    assert mlp.status == "fail" and [f.name for f in mlp.findings] == ["ffn_no_activation"], format_report(no_gelu)


def test_a_block_whose_mlp_residual_is_the_normed_input_fails(from_normed):
    (block,) = from_normed.components
    assert block.status == "fail", format_report(from_normed)
    assert [f.name for f in block.findings] == ["residual_from_normed"]
