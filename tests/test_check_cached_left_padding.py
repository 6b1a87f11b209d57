"""A batched generate over a left-padded batch with a KV cache is charged with a cache mismatch only
where its loop with the cache computes something else than the loop without it. Check's stand-in model
takes the loop's call as written: its arguments in place (model(ids, mask, position_ids, past) with
past=None first: a cache comes back), or by keyword (model(input_ids=..., attention_mask=...,
past_key_values=...)); the mask one column longer a step covers the cached tokens, and the position ids
it is handed are the ones it computes at. A model whose forward requires attention_mask and
position_ids is called with a mask of ones and positions (1, T). Planted loops still FAIL named. One check
run per fixture file."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_cached_left_padding"
RUNS = {"positional_loop": ["generate"], "keyword_loop": ["generate"], "positions_from_start": ["generate"],
        "cache_dropped": ["generate"], "position_ids_model": ["gpt"]}
CORRECT = {"positional_loop": "generate", "keyword_loop": "generate", "position_ids_model": "GPT"}
PLANTED = ("positions_from_start", "cache_dropped")


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=kinds) for name, kinds in RUNS.items()}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_left_padding_loop_and_its_model_pass(results, name):
    comp = component(results[name], CORRECT[name])
    assert comp.status == "pass", format_report(results[name])


def test_the_loops_are_driven_through_their_cache(results):
    for name in ("positional_loop", "keyword_loop"):
        loop = component(results[name], "generate")
        assert any("it decodes with a KV cache" in n["en"] for n in loop.notes), loop.notes
        assert any("left-padded batch" in c.name["en"] and c.ok for c in loop.checks), loop.checks


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_loop_still_fails_named(results, name):
    comp = component(results[name], "generate")
    assert comp.status == "fail", format_report(results[name])
    assert [f.name for f in comp.findings] == ["generate_cache_mismatch"], format_report(results[name])
