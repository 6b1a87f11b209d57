"""A function of logits driven in a form it does not take is not the learner's failure: where its code
refuses check's batch (B, V), one row (V,) and then a list of (token id, logit) pairs (llama.cpp's
candidates) are tried; one it takes is checked in that form (a sampler's draws, a filter's kept
tokens read back as a row of logits); none taken is NOT CHECKED with the forms tried. A function read
as a sampling step that returns logits is NOT CHECKED, and a model whose forward gives no logits
(B, T, V) but a tensor of another form is NOT CHECKED, never FAIL with nothing found. Planted mistakes
in the pairs form still FAIL named at their line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_sampler_forms"
# fixture -> the kinds it is checked for
RUNS = {"pairs": ["top_k", "sample"], "pairs_temperature_multiplied": ["sample"],
        "pairs_top_k_short": ["top_k"], "scores_dict": ["sample"], "pairs_named_sample": ["sample"], "list_model": ["gpt"],
        "row_model": ["gpt"]}
# (fixture, component) -> (status, the finding named, the line of it)
EXPECTED = {
    ("pairs", "top_k_filter"): ("pass", None, None), ("pairs", "sample_token"): ("pass", None, None),
    ("pairs_temperature_multiplied", "sample_token"): ("fail", "temperature_multiplied", 21),
    ("pairs_top_k_short", "top_k_filter"): ("fail", "top_k_off_by_one", 17),
    ("scores_dict", "sample_token"): ("not_checked", None, None),
    ("pairs_named_sample", "sample_top_k"): ("not_checked", None, None),
    ("list_model", "BigramLM"): ("not_checked", None, None), ("row_model", "TinyLM"): ("not_checked", None, None),
}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=kinds) for name, kinds in RUNS.items()}


@pytest.mark.parametrize("key", EXPECTED)
def test_a_function_is_driven_in_the_form_it_takes(results, key):
    name, component = key
    comp = next(c for c in results[name].components if c.name == component)
    status, finding, line = EXPECTED[key]
    assert comp.status == status, format_report(results[name])
    assert [(f.name, f.line) for f in comp.findings] == ([(finding, line)] if finding else [])


def test_what_was_tried_and_why_is_said(results):
    pairs = next(c for c in results["pairs"].components if c.name == "sample_token")
    assert any("(token id, logit) pairs" in n["en"] for n in pairs.notes)
    assert any("5,000 draws" in c.name["en"] for c in pairs.checks)
    (refused,) = results["scores_dict"].components
    assert "takes none of the forms" in refused.error.message and "pairs:" in refused.error.message
    (named,) = results["pairs_named_sample"].components
    assert "returns logits of the shape it is handed" in named.error.message
    (bigram,) = results["list_model"].components
    assert "returned a tensor of shape (29,)" in bigram.error.message
    assert "另一种形式" in bigram.error.message_zh
