"""Attention that walks the sequence in strides (fixtures/learners_chunked_attention/, memory-efficient
attention with a running max and sum over key chunks of its own default size): it is run over more
tokens than one chunk holds, not a multiple of it, so a running statistic that is not rescaled when the
max grows shows. The correct file passes that check; the accumulator left unrescaled fails it."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_chunked_attention"
PROBE = "its loop over the sequence in strides"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module")
def not_rescaled():
    return check_file(str(HERE / "acc_not_rescaled.py"))


def _probe(result) -> list[bool]:
    (attention,) = result.components
    return [c.ok for c in attention.checks if c.name["en"].startswith(PROBE)]


def test_the_chunked_attention_passes_over_several_chunks(correct):
    assert [c.status for c in correct.components] == ["pass"] and _probe(correct) == [True], format_report(correct)


def test_an_accumulator_left_unrescaled_fails_over_several_chunks(not_rescaled):
    assert [c.status for c in not_rescaled.components] == ["fail"], format_report(not_rescaled)
    assert _probe(not_rescaled) == [False], format_report(not_rescaled)
