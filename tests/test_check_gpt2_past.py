"""GPT-2 with Hugging Face's past_key_values (tests/fixtures/learners_gpt2_past/correct.py): the model
returns (loss, logits, presents) and a loop `greedy(model, input_ids, max_new_tokens,
use_cache)` decodes with the cache on. The model's cache is the presents after the logits; the loop is
a generation loop, driven with use_cache=True (through the stand-in as a (loss, logits, presents)
tuple where the model fails); a causal mask whose rows start at 0 fails on the cached call, at its
line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_results import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_gpt2_past" / "correct.py"
WRITTEN = "keep = self.bias[:, :, k_len - q_len:k_len, :k_len]"
PLANT = "keep = self.bias[:, :, :q_len, :k_len]"
CACHE_CHECK = "the KV cache it returns"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(CORRECT))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return planted_copy(CORRECT, tmp_path_factory.mktemp("gpt2_past"), "planted", (WRITTEN, PLANT))


def test_the_returned_cache_and_the_cached_loop_pass(correct):
    by_name = {c.name: c for c in correct.components}
    assert {c.status for c in correct.components} == {"pass"}, format_report(correct)
    assert by_name["greedy"].kind == "generate"
    assert any(c.ok and CACHE_CHECK in c.name["en"] for c in by_name["GPT2LMHeadModel"].checks)


def test_mask_rows_from_zero_fail_the_cached_call_at_their_line(planted):
    by_name = {c.name: c for c in planted.components}
    model = by_name["GPT2LMHeadModel"]
    assert model.status == "fail", format_report(planted)
    assert any(not c.ok and CACHE_CHECK in c.name["en"] for c in model.checks)
    assert any(f.code == PLANT for f in model.findings), format_report(planted)
    assert by_name["greedy"].status == "pass", format_report(planted)  # the stand-in's triple
