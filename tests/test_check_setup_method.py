"""A model whose forward reads what a method of its own makes first (core/setup_method.py): gpt-fast's
setup_caches(max_batch_size, max_seq_length) before forward(idx, input_pos), and a model's
allocate_kv(batch_size, max_len, dtype) that makes plain cache tensors. The method is found by what it
assigns and forward reads, called with check's batch size and length before each new sequence, and
noted; a generate that calls it is driven with the learner's own model (one prompt (T,) in gpt-fast's
form). A planted mistake FAILs, named; a setup argument check has no value for is NOT CHECKED, naming
the method and the argument."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_setup_method"
FILES = {"static_cache": ["gpt", "generate"], "static_cache_plant": ["mha", "gpt"],
         "static_cache_values_plant": ["gpt"],
         "allocated_kv": ["kv_cache", "generate"], "allocated_kv_plant": ["kv_cache", "generate"],
         "setup_unknown_argument": ["gpt"]}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=kinds) for name, kinds in FILES.items()}


def _one(results, name, component):
    return next(c for c in results[name].components if c.name == component)


@pytest.mark.parametrize(("name", "model", "loop", "method"), [
    ("static_cache", "Transformer", "generate", "setup_caches(max_batch_size, max_seq_length)"),
    ("allocated_kv", "CachedLM", "CachedLM.generate", "allocate_kv(batch_size, max_len, dtype)")])
def test_a_model_set_up_by_its_own_method_is_checked_with_its_loop(results, name, model, loop, method):
    comp = _one(results, name, model)
    assert comp.status == "pass", format_report(results[name])
    assert any(method in note["en"] and "先建好" in note["zh"] for note in comp.notes), format_report(results[name])
    assert _one(results, name, loop).status == "pass", format_report(results[name])


@pytest.mark.parametrize(("name", "component", "mistake"), [
    ("static_cache_plant", "Transformer", "no_scaling"),
    ("allocated_kv_plant", "CachedLM.generate", "generate_cache_mismatch")])
def test_a_planted_mistake_in_a_set_up_model_fails_named(results, name, component, mistake):
    comp = _one(results, name, component)
    assert comp.status == "fail", format_report(results[name])
    assert mistake in [f.name for f in comp.findings], format_report(results[name])


def test_a_plant_no_catalogue_names_is_quoted_in_forward_not_in_the_setup_method(results):
    """The value cache filled with the keys: the departing line is one forward runs, not the positions
    table setup_caches makes (its lines are not traced as the forward's steps)."""
    comp = _one(results, "static_cache_values_plant", "Transformer")
    lines = (HERE / "static_cache_values_plant.py").read_text(encoding="utf-8").splitlines()
    setup = lines.index("    def setup_caches(self, max_batch_size, max_seq_length):") + 1
    forward = lines.index("    def forward(self, idx: Tensor, input_pos: Optional[Tensor] = None) -> Tensor:") + 1
    assert comp.status == "fail", format_report(results["static_cache_values_plant"])
    quoted = [f.line for f in comp.findings]
    assert len(quoted) == 1 and not setup <= quoted[0] < forward, format_report(results["static_cache_values_plant"])


def test_a_setup_argument_check_cannot_fill_is_not_checked_named(results):
    comp = _one(results, "setup_unknown_argument", "Transformer")
    assert comp.status == "not_checked", format_report(results["setup_unknown_argument"])
    assert "setup_caches" in comp.error.message and "'layout'" in comp.error.message
    assert "setup_caches" in comp.error.message_zh
