"""`handformer check` on a model in the labml.ai annotated style: token ids sequence-first,
[seq_len, batch_size], and each layer called with keyword arguments (`layer(x=h, mask=mask)`). The
model is driven so and compared with handformer's; a layer that drops the residual around its
feed-forward fails at the line that sets the stream from the sublayer's output alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_labml"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module")
def no_residual():
    return check_file(str(HERE / "ff_no_residual.py"), only=["block", "gpt"])


def test_the_sequence_first_model_is_checked_and_passes(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"causal_mask": "pass", "SelfAttention": "pass", "FeedForward": "pass",
                      "sinusoids": "pass", "TransformerLayer": "pass", "SeqFirstLM": "pass"}, format_report(correct)


def test_a_missing_ffn_residual_fails_block_and_model_at_its_line(no_residual):
    for comp in no_residual.components:
        assert comp.status == "fail", format_report(no_residual)
        assert [(f.name, f.code) for f in comp.findings] == [("no_residual", "x = self.dropout(self.ff(z))")]
