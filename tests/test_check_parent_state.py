"""State a parent sets, and a raise that guards a setting, are not the component's fault:

- a KV cache only the model's setup method gives each attention (learners_parent_caches/): gpt-fast's
  `self.layers[i].attention.kv_cache = KVCache(...)`, and `for b in self.blocks: b.attn.k_cache,
  b.attn.v_cache = ...` in a tuple. The setup method is found by what it assigns on the model's parts,
  the model is read as decoder-only (its second argument names positions: input_pos, token_positions)
  and driven after the method, which runs at the model's dtype; the attention and block, which cannot
  run without it, are NOT CHECKED naming the method, never FAIL. A planted mistake FAILs the model at
  its line.
- `raise NotImplementedError` under an `if` or in an `else` (learners_guarded_raise/) refuses a setting;
  it is no starter's TODO, so a block whose own bug raises FAILs, and a correct one passes.

One module-scoped check run per file, shared by the asserts on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
LAYERS = ["mha", "causal_attention", "block"]
FILES = {
    "learners_parent_caches/tuple_targets.py": [*LAYERS, "kv_cache"],
    "learners_parent_caches/tuple_targets_concat_no_transpose.py": ["kv_cache"],
    "learners_parent_caches/indexed.py": [*LAYERS, "gpt"],
    "learners_parent_caches/indexed_ffn_unnormed.py": ["gpt"],
    "learners_guarded_raise/correct.py": ["block"],
    "learners_guarded_raise/ffn_transposed.py": ["block"],
}
RUNS: dict[str, object] = {}


def run(name: str):
    if name not in RUNS:
        RUNS[name] = check_file(str(FIXTURES / name), only=FILES[name])
    return RUNS[name]


def component(name: str, which: str):
    return next(c for c in run(name).components if c.name == which)


@pytest.mark.parametrize(("name", "model", "layers", "method"), [
    ("learners_parent_caches/tuple_targets.py", "CachedLM", ("CachedAttention", "Block"), "CachedLM.setup_caches"),
    ("learners_parent_caches/indexed.py", "Transformer", ("Attention", "Layer"), "Transformer.setup_caches"),
])
def test_parts_of_a_set_up_model_are_not_checked_the_model_passes(name, model, layers, method):
    assert component(name, model).status == "pass", format_report(run(name))
    assert "setup_caches(max_batch_size, max_seq_length) makes first" in format_report(run(name))
    for layer in layers:
        comp = component(name, layer)
        assert comp.status == "not_checked", format_report(run(name))
        assert f"which only {method}(...) assigns" in comp.error.message
        assert not comp.findings


@pytest.mark.parametrize(("name", "model", "line"), [
    ("learners_parent_caches/tuple_targets_concat_no_transpose.py", "CachedLM", 26),
    ("learners_parent_caches/indexed_ffn_unnormed.py", "Transformer", 55),
])
def test_a_plant_fails_the_set_up_model_at_its_line(name, model, line):
    comp = component(name, model)
    assert comp.status == "fail", format_report(run(name))
    assert comp.findings[0].line == line


def test_a_guarded_raise_is_no_todo():
    assert component("learners_guarded_raise/correct.py", "Block").status == "pass"
    raised = component("learners_guarded_raise/ffn_transposed.py", "Block")
    assert raised.status == "fail", format_report(run("learners_guarded_raise/ffn_transposed.py"))
    assert raised.error.kind == "exception" and "NotImplementedError" not in raised.error.message
