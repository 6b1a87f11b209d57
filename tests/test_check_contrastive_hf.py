"""Contrastive search as Hugging Face's `_contrastive_search` reads (fixtures/learners_contrastive_hf/):
its model returns an output with `.logits` and, asked by `output_hidden_states=True`, `.hidden_states`,
and its `max_length` counts the prompt. It is read as contrastive search all the same (its second call
is each row k times, each with one of its k likeliest tokens appended) and passes; the penalty added
and the similarities averaged (in a helper it calls) fail, each at its line. The candidates fed
candidate-major (`repeat`), or alone with the cache expanded (Hugging Face's cached search), are read
too and pass; a search in a form not read (its candidates sorted by id) calls the model on more rows
than prompts and is NOT CHECKED, with that reason, never FAIL."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_contrastive_hf"
PLANTS = {"penalty_added": 67, "similarity_averaged": 51}  # the file, its planted line


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"), only=["gpt", "generate"])


@pytest.fixture(scope="module", params=list(PLANTS))
def planted(request):
    return request.param, check_file(str(HERE / f"{request.param}.py"), only=["generate"])


def test_an_hf_style_contrastive_search_passes(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"CausalLM": "pass", "contrastive_search": "pass"}, format_report(correct)
    search = next(c for c in correct.components if c.name == "contrastive_search")
    assert "contrastive search (k = 4, alpha = 0.6" in search.checks[0].name["en"], format_report(correct)
    assert any("max_length" in n["en"] for n in search.notes), format_report(correct)


@pytest.fixture(scope="module", params=["correct_candidate_major", "correct_cached", "correct_sorted_candidates"])
def other_form(request):
    return request.param, check_file(str(HERE / f"{request.param}.py"), only=["generate"])


def test_other_forms_pass_or_are_not_checked(other_form):
    name, result = other_form
    search = next(c for c in result.components if c.name == "contrastive_search")
    if name == "correct_sorted_candidates":
        assert search.status == "not_checked" and "8 rows for 2 prompts" in search.error.message, \
            format_report(result)
    else:
        assert search.status == "pass" and "contrastive search (k = 4" in search.checks[0].name["en"], \
            format_report(result)


def test_a_planted_mistake_fails_at_its_line(planted):
    name, result = planted
    search = next(c for c in result.components if c.name == "contrastive_search")
    assert search.status == "fail" and [f.line for f in search.findings] == [PLANTS[name]], format_report(result)
