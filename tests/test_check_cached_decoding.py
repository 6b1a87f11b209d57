"""Cached decoding as learners write it (fixtures/learners_cached_decoding/): a Meta-style model that
keeps its KV cache in buffers, takes start_pos with a default of 0 and gives the last position's
logits alone (DeepSeek's model.py does both); and a Mistral-style loop that calls
model.forward(ids, positions, cache) itself. Correct, both pass with the cache checked; a rotary
table read from position 0 on the cached calls is rope_no_offset, quoted at its line. A model whose
cache only use_cache=True turns on is not driven through it without that."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_cached_decoding"


def _checked(name: str, kinds: list[str]) -> tuple[dict[str, str], list[tuple[str, int | None]], str]:
    result = check_file(str(HERE / name), only=kinds)
    findings = [(f.name, f.line) for c in result.components if c.status == "fail" for f in c.findings]
    return {c.name: c.status for c in result.components}, findings, format_report(result)


@pytest.fixture(scope="module")
def last_correct():
    return _checked("last_logits_correct.py", ["gpt"])


@pytest.fixture(scope="module")
def last_planted():
    return _checked("last_logits_rope_no_offset.py", ["gpt"])


@pytest.fixture(scope="module")
def loop_planted():
    return _checked("positions_loop_rope_no_offset.py", ["gpt", "generate"])


def test_a_defaulted_start_pos_and_last_logits_are_checked_through_the_cache(last_correct):
    statuses, _, report = last_correct
    assert statuses == {"Llama": "pass"}, report
    assert "the KV cache: tokens 5..7 given after 0..4 with start_pos=5" in report, report


def test_a_table_read_from_zero_on_cached_calls_is_named_at_its_line(last_planted):
    statuses, findings, report = last_planted
    assert statuses == {"Llama": "fail"}, report
    assert findings == [("rope_no_offset", 112)], report


def test_a_loop_calling_forward_itself_is_localized_inside_the_model(loop_planted):
    statuses, findings, report = loop_planted
    assert statuses == {"Transformer": "pass", "generate": "fail"}, report
    assert findings == [("rope_no_offset", 97)], report


def test_the_correct_loop_passes():
    statuses, _, report = _checked("positions_loop_correct.py", ["gpt", "generate"])
    assert statuses == {"Transformer": "pass", "generate": "pass"}, report


def test_a_cache_switched_on_by_use_cache_is_not_driven_without_it():
    statuses, _, report = _checked("use_cache_correct.py", ["gpt"])
    assert statuses == {"Llama": "pass"}, report
