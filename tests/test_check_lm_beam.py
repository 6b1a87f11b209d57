"""`handformer check` on a decoder-only model's beam search with a KV cache: found by its signature
(a model, a prompt and a beam width, no start symbol), driven through the learner's own model with
its logits steered and its cache made to carry the token ids, and graded by beam search's runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY = Path(__file__).parent / "fixtures" / "learners_lm_beam"


def test_the_cached_attention_model_and_beam_search_pass():
    """The attention's forward(x, cache=None) is driven without a cache (not handed a key as its
    cache), and the search through the model's cache of one (B, T, 2D) tensor a layer."""
    result = check_file(str(FAMILY / "correct.py"))
    statuses = [(c.name, c.kind, c.status) for c in result.components]
    assert statuses == [("CachedAttention", "causal_attention", "pass"), ("MiniGPT", "gpt", "pass"),
                        ("decode_with_beams", "beam_search", "pass")], format_report(result)
    assert "KV cache" in result.components[-1].driven["en"]


@pytest.mark.parametrize(("plant", "only", "name", "line"), [
    ("beam_eos_not_emitted", ["gpt", "beam_search"], "beam_eos_not_emitted", 85),
    # the search alone: its model, not checked in this run, is built and drives it
    ("first_position", ["beam_search"], "beam_one_not_greedy", 76)])
def test_a_planted_search_is_named_at_its_line(plant: str, only: list[str], name: str, line: int):
    result = check_file(str(FAMILY / f"{plant}.py"), only=only)
    search = result.components[-1]
    assert [c.status for c in result.components] == ["pass"] * (len(only) - 1) + ["fail"], format_report(result)
    assert [(f.name, f.line) for f in search.findings] == [(name, line)]
