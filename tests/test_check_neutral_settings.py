"""Settings the reference has no place for, read from the code's form (a config field its code reads,
a constructor's argument with a default), are graded at their neutral values: a decoder layer whose
even layers see only their last `config.sliding_window` tokens of the mask it is handed, and an AdamW
whose second moment is refreshed every `update_interval` steps. Correct, each passes at the neutral
value with a note naming the setting and both values; a catalogued mistake outside the setting still
FAILs, named (one the first run could not name is named at the neutral value); a departure with no
name while such a setting is read is NOT CHECKED, the setting named, never FAIL."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.neutral_settings import neutral_value, settings_read
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_neutral_settings"
KINDS = {"window_layer": "block", "window_layer_scale_by_dk": "block", "window_layer_clamped": "block",
         "interval_adamw": "optimizer", "interval_adamw_no_bias_correction": "optimizer"}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=[kind]) for name, kind in KINDS.items()}


def _one(results, name):
    (comp,) = results[name].components
    return comp


@pytest.mark.parametrize(("name", "setting"), [("window_layer", "sliding_window = 4096 (your value 3 not checked)"),
                                               ("interval_adamw", "update_interval = 1 (your value 4 not checked)")])
def test_a_correct_component_passes_at_the_neutral_value_named(results, name, setting):
    comp = _one(results, name)
    assert comp.status == "pass", format_report(results[name])
    (note,) = [n for n in comp.notes if "neutral value" in n["en"]]
    assert f"checked with {setting}" in note["en"], note
    assert setting.split(" (")[0] in note["zh"] and "中性值" in note["zh"], note


@pytest.mark.parametrize(("name", "mistake", "line"), [
    ("window_layer_scale_by_dk", "scale_by_dk", "scores = q @ k.transpose(-2, -1) / self.head_dim  # (B, H, T, T)"),
    ("interval_adamw_no_bias_correction", "adamw_no_bias_correction", 'm_hat = state["m"]')])
def test_a_catalogued_mistake_outside_the_setting_still_fails_at_its_line(results, name, mistake, line):
    comp = _one(results, name)
    assert comp.status == "fail", format_report(results[name])
    assert [(f.name, f.code) for f in comp.named()] == [(mistake, line)], comp.findings


def test_a_departure_with_no_name_while_a_setting_is_read_is_not_checked(results):
    comp = _one(results, "window_layer_clamped")
    assert comp.status == "not_checked", format_report(results["window_layer_clamped"])
    assert "(sliding_window = 3)" in comp.error.message and "（sliding_window = 3）" in comp.error.message_zh


@pytest.mark.parametrize(("name", "value", "neutral"), [
    ("sliding_window", 3, 4096), ("attention_chunk_size", 8, 8), ("update_interval", 10, 1), ("sliding_window_pattern", 6, 1),
    ("aux_loss_coef", 0.01, 0.0), ("attn_scale", 0.1, 1.0), ("use_sliding_window", True, False), ("use_temperature_tuning", True, True),
    ("hidden_size", 64, 64), ("rms_norm_eps", 1e-6, 1e-6), ("rope_theta", 500000.0, 500000.0),
    ("use_qk_norm", True, True), ("initializer_range", 0.02, 0.02)])
def test_a_setting_s_neutral_value_is_read_from_its_name(name, value, neutral):
    """A size, an eps, RoPE's base, QK-norm: check maps them; a name of no form has no neutral value (a
    chunk none: it may only tile the computation, as flash attention's, where a wide one hides a mistake)."""
    assert neutral_value(name, value) == neutral and type(neutral_value(name, value)) is type(neutral)


@dataclasses.dataclass
class _Settings:  # a class of settings only: its fields count where the component's code reads them
    drop_every: int = 3
    unread_every: int = 5


class _Holder:
    def step(self, x: list[int], settings: _Settings) -> list[int]:
        return x[:: settings.drop_every]


def test_a_method_s_settings_are_read_from_its_own_indented_source():
    """A method's source is indented: read alone, its config fields count (`drop_every`), a field it
    never reads does not."""
    assert [(s.name, s.value, s.neutral) for s in settings_read(_Holder.step)] == [("drop_every", 3, 1)]
