"""An argument is a configuration by its use, not by its position or name: one whose fields the
constructor reads (`config.d_model`, `hp.n_embd`) is handed a config, never a size, even where it sits
where a width would (OLMo's Block(layer_id, config) hands it to LayerNorm(config) first), and a field
read as `config.a or config.b` stands for b's size (a padded vocabulary, `embedding_size or vocab_size`).
Two forms: a dataclass config second and an untyped `hp` namespace second; each correct file passes
with its block and model checked, each planted file FAILs with its mistake named. A generation loop's
count of new tokens may be called max_steps (OLMo's generate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_config_by_use"
FILES = ("olmo_config", "olmo_config_plant", "hparams_second", "hparams_second_plant")


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=["block", "gpt", "generate"]) for name in FILES}


def _statuses(report):
    return {c.name: c.status for c in report.components}


@pytest.mark.parametrize(("name", "block", "model"), [
    ("olmo_config", "SequentialBlock", "OLMoLike"), ("hparams_second", "Block", "TinyLM")])
def test_a_config_in_a_width_s_place_is_built_and_checked(results, name, block, model):
    assert {block: "pass", model: "pass"}.items() <= _statuses(results[name]).items(), format_report(results[name])


def test_a_loop_of_max_steps_new_tokens_is_asked_for_that_many(results):
    """OLMo's generate(input_ids, max_steps): the count of new tokens under that name."""
    assert _statuses(results["olmo_config"])["OLMoLike.generate"] == "pass", format_report(results["olmo_config"])


@pytest.mark.parametrize(("name", "model", "mistake"), [
    ("olmo_config_plant", "OLMoLike", "causal_mask_missing"), ("hparams_second_plant", "TinyLM", "scale_by_dk")])
def test_a_planted_mistake_behind_a_config_fails_named(results, name, model, mistake):
    comp = next(c for c in results[name].components if c.name == model)
    assert comp.status == "fail", format_report(results[name])
    assert mistake in [f.name for f in comp.findings], format_report(results[name])
