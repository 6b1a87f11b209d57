"""A model whose forward returns its hidden states on purpose (runners/gpt.py, _head_read_apart): the
file's loss reads the output layer (`model.lm_head.weight`, a chunked cross entropy) and applies it
itself, so the model is a backbone, checked as the stack of its layers, never charged for missing
logits; the same model with nothing else reading lm_head forgot to apply its head and still FAILs."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_head_apart"


@pytest.fixture(scope="module")
def results():
    out = {}
    for name in ("chunked.py", "forgot_head.py"):
        result = check_file(str(HERE / name), only=["gpt"])
        out[name] = ({c.name: c.status for c in result.components}, format_report(result))
    return out


def test_a_head_the_loss_applies_leaves_a_backbone_checked_as_a_stack(results):
    status, report = results["chunked.py"]
    assert status == {"GPT": "pass"}, report
    assert "a backbone, checked as the stack of its layers" in report, report


def test_a_head_nothing_applies_is_still_missing_logits(results):
    status, report = results["forgot_head.py"]
    assert status == {"GPT": "fail"}, report
    assert "logits of shape (B, T, vocab_size)" in report, report
