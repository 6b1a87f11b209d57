"""Check's own steps never raise on a learner's form: unusual but valid forms are read, or declined as
NOT CHECKED with the reason and the adapter, never an internal error or an error charged to them.

The forms (tests/fixtures/learners_unusual_forms/): an attention holding a 0-d parameter (a learned mix
of the first layer's values, handed in and back as (y, values); a learned temperature, returning
(y, weights)); a rotary table built from a config object (the head width dim // n_heads, read; a config
whose fields check cannot fill, declined); a tokenizer whose encode returns subword strings (a list, a
tuple); loops returning a dict (the tokens its one value of ids); a block that requires the rotary
tables its model builds (a complex table, a (cos, sin) pair), its code speaking of rotating."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_unusual_forms"
FILES = ("value_mix", "scalar_temperature", "config_freqs", "model_width_freqs", "subword_list",
         "subword_tuple", "dict_loops", "dict_generate", "rotary_block",
         "halves_block")


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py")) for name in FILES}


def _one(results, name, component):
    return next(c for c in results[name].components if c.name == component)


@pytest.mark.parametrize("name", FILES)
def test_no_component_ends_in_check_s_own_error(results, name):
    result = results[name]
    assert result.error is None and result.components, format_report(result)
    for comp in result.components:
        assert comp.status != "error", format_report(result)
        assert comp.error is None or comp.error.kind != "internal", format_report(result)


@pytest.mark.parametrize(("name", "component"), [
    ("value_mix", "Attention"), ("scalar_temperature", "TemperedSelfAttention"),
    ("config_freqs", "precompute_freqs_cis"), ("dict_loops", "generate"), ("dict_generate", "generate"),
    ("rotary_block", "Block"), ("halves_block", "Block"), ("halves_block", "GPT")])
def test_each_unusual_form_is_read(results, name, component):
    assert _one(results, name, component).status == "pass", format_report(results[name])


@pytest.mark.parametrize(("name", "component", "said"), [
    ("model_width_freqs", "precompute_freqs_cis", "takes a config object"),
    ("subword_list", "BPE", "subword strings|word-level BPE"),
    ("subword_tuple", "Tokenizer", "subword strings|word-level BPE")])
def test_a_form_check_cannot_read_is_declined_with_its_reason(results, name, component, said):
    comp = _one(results, name, component)
    if comp.status == "pass":  # a later grader may read the form: then it passes
        return
    assert comp.status == "not_checked", format_report(results[name])
    assert any(words in comp.error.message for words in said.split("|")), format_report(results[name])
    assert comp.error.message_zh, format_report(results[name])  # the word-level BPE's reader says why
