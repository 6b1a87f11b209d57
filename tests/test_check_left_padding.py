"""A decoder-only model whose forward takes Hugging Face's 2-D attention_mask
(fixtures/learners_gpt2_left_padding/, GPT-2's learned positions and additive mask): with the padding
at the start of a row, the real tokens' logits must not move when only the padded tokens change. The
correct model passes that check; a mask built over the queries ((B, 1, T, 1)) fails, named at its line;
a model that takes the mask and never reads it is not judged by it."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_gpt2_left_padding"
PROBE = "left padding: with attention_mask"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"), only=["gpt"])


@pytest.fixture(scope="module")
def unread():
    return check_file(str(HERE / "mask_unread.py"), only=["gpt"])


@pytest.fixture(scope="module")
def over_queries():
    return check_file(str(HERE / "mask_over_queries.py"), only=["gpt"])


def _line(text: str, result) -> int:
    return next(n for n, line in enumerate(Path(result.path).read_text().splitlines(), 1) if text in line)


def test_the_correct_model_passes_the_left_padding_probe(correct):
    (model,) = correct.components
    probe = [c for c in model.checks if c.name["en"].startswith(PROBE)]
    assert model.status == "pass" and [c.ok for c in probe] == [True], format_report(correct)


def test_a_mask_over_the_queries_is_named_at_its_line(over_queries):
    (model,) = over_queries.components
    found = [(f.name, f.line) for f in model.findings]
    line = _line("attention_mask[:, None, :, None]", over_queries)
    assert model.status == "fail" and found == [("mask_hides_queries", line)], format_report(over_queries)


def test_a_mask_taken_and_never_read_is_not_judged(unread):
    (model,) = unread.components
    probe = [c for c in model.checks if c.name["en"].startswith(PROBE)]
    assert model.status == "pass" and probe == [], format_report(unread)
