"""An argument is a configuration by its use, not by its position or name: one whose fields the
constructor reads (`config.d_model`, `hp.n_embd`) is handed a config, never a size, even where it sits
where a width would (OLMo's Block(layer_id, config) hands it to LayerNorm(config) first), and a field
read as `config.a or config.b` stands for b's size (a padded vocabulary, `embedding_size or vocab_size`).
Two forms: a dataclass config second and an untyped `hp` namespace second; each correct file passes
with its block and model checked, each planted file FAILs with its mistake named. A generation loop's
count of new tokens may be called max_steps (OLMo's generate)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from torch import nn

from handformer.check.core.discovery import make_config
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


class _Wrapped(nn.Module):
    def __init__(self, base, scale=2.0):
        super().__init__()
        self.base, self.rank = base, base.in_features // 4  # a layer it is handed, read as a layer


class _Configured(nn.Module):
    def __init__(self, width, hp):
        super().__init__()
        self.proj = nn.Linear(hp.n_embd, width)  # a namespace of another name, read by its fields


def test_an_argument_read_as_a_layer_is_no_configuration():
    """`base.in_features` reads a layer (LoRA's base_layer), `hp.n_embd` a configuration."""
    base, hp = (inspect.signature(cls).parameters[name] for cls, name in ((_Wrapped, "base"), (_Configured, "hp")))
    assert make_config(_Wrapped, base, {"d_model": 16, "n_heads": 4}) is None
    assert make_config(_Configured, hp, {"d_model": 16, "n_heads": 4}).n_embd == 16
