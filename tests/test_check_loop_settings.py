"""A generation loop whose settings come as one object of the file's own class is built at its
defaults with check's count: settings that have a neutral value (the penalties) are set to it and
graded there, settings the reference has no place for (a Mirostat-style eta) are named. A loop that
departs while it holds such a setting is NOT CHECKED, never FAIL; a required one with no neutral
value is NOT CHECKED; a catalogued mistake (the temperature multiplied) and a departure of a loop with
neutral settings only still FAIL. Loops that run each prompt through the model on its own, over lists
of ids, are driven so."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_loop_settings"
NAMES = ("penalty_params", "penalty_params_first_position", "penalty_arguments", "penalty_arguments_first_window",
         "running_target", "running_target_prepended", "running_target_required",
         "running_target_temperature_multiplied")
# the repetition penalty of a settings object is also run at 1.5 (runners/generate_penalty.py): not said neutral
NEUTRAL = {"penalty_params": "its settings object settings at presence_penalty=0.0, frequency_penalty=0.0: "
                             "their neutral values",
           "penalty_arguments": "its arguments at repetition_penalty=1.0, frequency_penalty=0.0: their neutral "
                                "values"}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=["generate"]) for name in NAMES}


def _one(results, name):
    (comp,) = results[name].components
    return comp


@pytest.mark.parametrize("name", NEUTRAL)
def test_settings_on_by_default_are_graded_at_their_neutral_values(results, name):
    comp = _one(results, name)
    assert comp.status == "pass", format_report(results[name])
    assert NEUTRAL[name] in " ".join(n["en"] for n in comp.notes)
    assert "中性取值" in " ".join(n["zh"] for n in comp.notes)


def test_a_setting_of_no_place_is_named_where_the_loop_passes(results):
    comp = _one(results, "running_target")
    assert comp.status == "pass", format_report(results["running_target"])
    assert "no place for (eta=0.1)" in " ".join(n["en"] for n in comp.notes)


def test_a_departure_with_a_setting_of_no_place_is_not_checked(results):
    comp = _one(results, "running_target_prepended")
    assert comp.status == "not_checked", format_report(results["running_target_prepended"])
    assert "eta=0.1" in comp.error.message and "eta=0.1" in comp.error.message_zh and not comp.findings


def test_a_required_setting_with_no_neutral_value_is_not_checked(results):
    comp = _one(results, "running_target_required")
    assert comp.status == "not_checked" and "requires tau" in comp.error.message, format_report(
        results["running_target_required"])


@pytest.mark.parametrize("name, line", [("running_target_temperature_multiplied", 26),
                                        ("penalty_params_first_position", None),
                                        ("penalty_arguments_first_window", None)])
def test_a_planted_mistake_still_fails(results, name, line):
    comp = _one(results, name)
    assert comp.status == "fail", format_report(results[name])
    if line is not None:
        assert [(f.name, f.line) for f in comp.findings] == [("temperature_multiplied", line)]
