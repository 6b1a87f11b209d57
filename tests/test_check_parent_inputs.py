"""A layer driven with what its parent computes and hands it (tests/fixtures/learners_parent_inputs,
handformer/check/core/parent_inputs.py): a rotary table the model builds once and hands down two levels
(a layer's forward(x, angles) and its attention's), and a padding mask a GPT's forward requires under a
name of its own (forward(idx, pad_mask), vLLM's key_mask). Each correct file passes with every component
checked; each planted one fails, its line quoted. A layer that raises on check's own inputs beside its
model's (a (cos, sin) pair where the model hands a complex table, as Llama 4's) is NOT CHECKED, never FAIL."""

from __future__ import annotations

import pytest
from check_results import FIXTURES, checked, component, notes, planted_copy, statuses

from handformer.check.core import parent_inputs
from handformer.check.core.report import format_report
from handformer.check.core.result import LearnerError

pytestmark = pytest.mark.usefixtures("one_thread")

FOLDER = "learners_parent_inputs"
SCALE = ("        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, T, T)",
         "        scores = q @ k.transpose(-2, -1) / self.head_dim  # (B, H, T, T)")
SEES_NEXT = ("        causal = torch.ones(T, T, dtype=torch.bool).tril()",
             "        causal = torch.ones(T, T, dtype=torch.bool).tril(1)")


@pytest.fixture(scope="module")
def rotary():
    return checked(FOLDER, "rotary_handed")


@pytest.fixture(scope="module")
def mask():
    return checked(FOLDER, "mask_handed")


@pytest.fixture(scope="module")
def rotary_planted(tmp_path_factory):
    return planted_copy(FIXTURES / FOLDER / "rotary_handed.py", tmp_path_factory.mktemp("rotary"), "rotary", SCALE)


@pytest.fixture(scope="module")
def mask_planted(tmp_path_factory):
    return planted_copy(FIXTURES / FOLDER / "mask_handed.py", tmp_path_factory.mktemp("mask"), "mask", SEES_NEXT)


def test_layers_handed_a_rotary_table_by_their_model_are_driven_with_it_and_pass(rotary):
    result = rotary
    assert set(statuses(result).values()) == {"pass"}, format_report(result)
    assert {"SelfAttention", "Layer", "RotaryLM"} <= set(statuses(result))
    for name in ("SelfAttention", "Layer"):
        assert "driven with the inputs your RotaryLM passes it" in notes(result, name)


def test_a_model_requiring_a_padding_mask_of_its_own_name_is_handed_ones_and_passes(mask):
    result = mask
    assert statuses(result) == dict.fromkeys(("Attention", "Block", "GPT"), "pass"), format_report(result)


def test_a_plant_in_a_layer_driven_through_its_model_fails_at_its_line(rotary_planted):
    result = rotary_planted
    for name in ("SelfAttention", "Layer"):
        assert component(result, name).status == "fail", format_report(result)
    assert SCALE[1].strip() in [f.code for f in component(result, "SelfAttention").findings]


def test_a_plant_in_a_model_handed_its_padding_mask_fails_at_its_line(mask_planted):
    gpt = component(mask_planted, "GPT")
    assert gpt.status == "fail" and SEES_NEXT[1].strip() in [f.code for f in gpt.findings], gpt



class _Layer:  # a layer class check drove with what its parent passed
    pass


def test_a_layer_raising_on_checks_own_inputs_beside_its_models_is_not_checked_never_failed(monkeypatch):
    monkeypatch.setitem(parent_inputs.NOTES, _Layer, "Model")
    raised = LearnerError("exception", "TypeError: tuple indices must be integers", "forward", ["line 3"])
    why = parent_inputs.parent_not_charged(_Layer, raised)
    assert why.kind == "cannot_call" and "the inputs your Model passes it" in why.message, why
    assert parent_inputs.parent_not_charged(object, raised) is raised  # driven by check alone: as raised
