"""Contrastive search (fixtures/learners_contrastive/), read from what it does (a second call on each
context row k times, each with one of its k likeliest tokens appended) and graded against a reference
of it on the learner's own model, its logits as they are: correct, it passes; the degeneration penalty
added instead of subtracted fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_contrastive"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"), only=["gpt", "generate"])


@pytest.fixture(scope="module")
def added():
    return check_file(str(HERE / "penalty_added.py"), only=["gpt", "generate"])


def test_the_model_and_its_contrastive_search_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"GPT": "pass", "contrastive_generate": "pass"}, format_report(correct)
    search = next(c for c in correct.components if c.name == "contrastive_generate")
    assert "contrastive search (k = 5, alpha = 0.5" in search.checks[0].name["en"], format_report(correct)


def test_the_penalty_added_fails_at_its_line(added):
    search = next(c for c in added.components if c.name == "contrastive_generate")
    assert search.status == "fail" and [f.line for f in search.findings] == [54], format_report(added)
