"""A model with vectors of its own beside the tokens (tests/fixtures/learners_prefix_tuning/): P-Tuning
v2's prefix keys and values, looked up in a table of their own ids (not the tokens'), and prompt tuning's
soft prompt put before the tokens' embeddings. handformer's CausalLM has neither, so the model is NOT
CHECKED naming what it has (never a FAIL, never check's own error: a token id looked up in the prefix's
table raised in check's search for where it departs); its attention and block are checked, and a
planted mistake there still FAILs at its line. One check run per fixture file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import component, planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_prefix_tuning"
UNSCALED = ("att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))", "att = q @ k.transpose(-2, -1)")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    planted = planted_copy(tmp_path_factory.mktemp("prefix"), "past_prefix_unscaled", HERE / "past_prefix.py",
                           UNSCALED)
    return {"past_prefix": check_file(str(HERE / "past_prefix.py")),
            "soft_prompt": check_file(str(HERE / "soft_prompt.py"), only=["gpt"]),
            "unscaled": check_file(planted, only=["causal_attention"])}


@pytest.mark.parametrize("name, model, said", [
    ("past_prefix", "PrefixTunedGPT", "it computes a learned term with prompt (6, 64)"),
    ("soft_prompt", "SoftPromptLM", "its first block is handed (2, 13, 16) for ids of shape (2, 8)")])
def test_a_model_with_vectors_of_its_own_is_not_checked_naming_them(results, name, model, said):
    comp = component(results[name], model)
    assert (comp.status, comp.error.kind) == ("not_checked", "mapping"), format_report(results[name])
    assert said in comp.error.message, comp.error.message


def test_its_layers_are_checked_and_a_planted_one_fails_at_its_line(results):
    for name in ("CausalSelfAttention", "Block"):
        assert component(results["past_prefix"], name).status == "pass", format_report(results["past_prefix"])
    comp = component(results["unscaled"], "CausalSelfAttention")
    assert comp.status == "fail", format_report(results["unscaled"])
    assert UNSCALED[1] in comp.findings[0].code, format_report(results["unscaled"])


@pytest.mark.parametrize(("positions", "soft_prompt"), [(13, True), (8, False), (1, False)])
def test_only_more_positions_than_tokens_is_a_soft_prompt(monkeypatch, positions, soft_prompt):
    """A first block handed more positions than tokens holds vectors of the model's own; one handed fewer
    (a model that takes one token a call with its cache, Umar Jamil's Llama) is read on."""
    from handformer.check.core.weights import MappingError
    from handformer.check.runners import gpt

    monkeypatch.setattr(gpt, "_handed", lambda call, m, idx: torch.zeros(2, positions, 16))
    idx, m = torch.zeros(2, 8, dtype=torch.long), object()
    if soft_prompt:
        with pytest.raises(MappingError):
            gpt._position_a_token(None, m, idx)
    else:
        assert gpt._position_a_token(None, m, idx) is m
