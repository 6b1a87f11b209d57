"""check on attention in other arrangements than (B, T, D): layers that run sequence-first inside a
model of (B, T) ids (ChatGLM's, PyTorch's nn.Transformer tutorial's), an attention handed q, k, v already
projected (ChatGLM's CoreAttention on (T, B, H, Dh), an eager attention on (B, T, H, Dh) with its heads
merged on the way out), and a grader error that reaches the learner as a NOT CHECKED in plain words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handformer.check.core import engine
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report, to_json

HERE = Path(__file__).parent / "fixtures" / "learners_seq_first"


def _check(name: str, only: list[str]) -> dict[str, object]:
    result = check_file(str(HERE / name), only=only)
    return {c.name: c for c in result.components} | {"": result}


@pytest.fixture(scope="module")
def glm() -> dict[str, object]:
    return _check("glm_style.py", ["sdpa", "mha", "block", "gpt"])


def test_a_model_of_ids_whose_layers_run_sequence_first_is_checked(glm):
    report = format_report(glm[""])
    assert {n: c.status for n, c in glm.items() if n} == {
        "CoreAttention": "differs", "QKVAttention": "pass", "GLMLayer": "pass", "GLMModel": "pass"}, report
    assert glm["CoreAttention"].kind == "sdpa", report  # q, k, v handed in: scaled dot-product attention


def test_a_core_attention_without_its_scale_fails_on_its_line():
    planted = _check("glm_planted.py", ["sdpa"])["CoreAttention"]
    assert planted.status == "fail"
    assert [(f.name, f.line) for f in planted.findings][0] == ("no_scaling", 34)


@pytest.fixture(scope="module")
def torch_style() -> dict[str, object]:
    return _check("torch_style.py", ["block", "gpt"])


def test_a_model_that_turns_its_ids_sequence_first_is_checked(torch_style):
    assert {n: c.status for n, c in torch_style.items() if n} == {"Block": "pass", "TinyLM": "pass"}, \
        format_report(torch_style[""])


def test_its_planted_residual_fails_on_its_line():
    planted = _check("torch_planted.py", ["block"])["Block"]
    assert planted.status == "fail"
    assert [(f.name, f.line) for f in planted.findings] == [("residual_from_normed", 35)]


def test_an_eager_attention_on_heads_last_but_one_is_checked_and_its_softmax_axis_fails():
    right = _check("eager_core.py", ["sdpa"])["EagerAttention"]
    assert (right.kind, right.status) == ("sdpa", "pass"), format_report(_check("eager_core.py", ["sdpa"])[""])
    wrong = _check("eager_planted.py", ["sdpa"])["EagerAttention"]
    assert wrong.status == "fail" and wrong.error is None  # its numbers differ: it does not raise


def test_an_attention_whose_helper_builds_its_projections_stays_multi_head():
    comp = _check("helper_projections.py", ["mha", "sdpa"])["MultiHeadAttention"]
    assert (comp.kind, comp.status) == ("mha", "pass")


def _raises(*_: object) -> None:
    raise RuntimeError("The size of tensor a (2) must match the size of tensor b (8)")


def test_a_grader_error_is_not_checked_in_plain_words(monkeypatch):
    monkeypatch.setattr(engine, "runner_for", lambda kind: _raises)
    result = check_file(str(HERE / "eager_core.py"), only=["sdpa"])
    [comp] = result.components
    assert comp.status == "not_checked" and comp.adapter.startswith("def make_sdpa(")
    for lang in ("en", "zh"):
        shown = format_report(result, lang)
        assert "a bug" not in shown and "的 bug" not in shown and "RuntimeError" not in shown, shown
    assert "--debug" in format_report(result) and "--debug" in format_report(result, "zh")
    assert "RuntimeError: The size of tensor a (2)" in format_report(result, debug=True)
    assert "RuntimeError" in json.loads(to_json(result))["components"][0]["error"]["detail"]
