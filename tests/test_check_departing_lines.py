"""Planted mistakes quoted at the line where the computation departs, not at a later use, and a base
check's heads are too narrow to show: tests/fixtures/learners_neox_zh/correct.py (a GPT-NeoX decoder
written as a Chinese tutorial: partial rotary over half of each head, its config's rotary_emb_base
50000, inv_freq its only table) and a planted copy of another style's fixture (Hugging Face's Llama
RMSNorm); tests/fixtures/learners_window_zh/correct.py (a small GPT whose
attention masks keys window or more positions back, the distance compared with the setting)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_results import FIXTURES, component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

NEOX = FIXTURES / "learners_neox_zh" / "correct.py"
BASE_HANDED = "self.rotary_emb = NeoXRotary(self.rotary_ndims, base=config.rotary_emb_base)"
BASE_LEFT_OUT = "self.rotary_emb = NeoXRotary(self.rotary_ndims)"


def _planted(folder: Path, source: Path, name: str, only: list[str], *replacements: tuple[str, str]):
    """`source` with each (written, plant) replaced, checked for the kinds `only` names."""
    text = source.read_text()
    for written, plant in replacements:
        assert written in text, f"{source.name} no longer holds {written!r}"
        text = text.replace(written, plant)
    path = folder / f"{name}.py"
    path.write_text(text)
    return check_file(str(path), only=only)


def _finding(result, name: str):
    found = [(f.name, f.line, f.code) for f in component(result, name).findings]
    assert found, format_report(result)
    return found[0]


def _line_of(path: Path, written: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if written in line)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("departing_lines")


def test_partial_rotary_model_with_its_config_base_passes():
    result = check_file(str(NEOX), only=["gpt"])
    assert component(result, "NeoXForCausalLM").status == "pass", format_report(result)


def test_base_left_out_of_a_partial_rotary_fails_at_the_call(folder):
    """Heads of 4, half of each turned: one pair, turned at frequency 1 whatever the base. The base is
    read at a wider build; the line quoted is the call that leaves the config's base out."""
    result = _planted(folder, NEOX, "base_left_out", ["gpt"], (BASE_HANDED, BASE_LEFT_OUT))
    assert _finding(result, "NeoXForCausalLM")[:2] == ("rope_wrong_base", _line_of(NEOX, BASE_HANDED))


def test_base_left_out_of_a_full_rotary_is_named_from_inv_freq(folder):
    result = _planted(folder, NEOX, "full_base_left_out", ["gpt"], (BASE_HANDED, BASE_LEFT_OUT),
                      ("rotary_pct: float = 0.5 ", "rotary_pct: float = 1.0 "))
    assert _finding(result, "NeoXForCausalLM")[:2] == ("rope_wrong_base", _line_of(NEOX, BASE_HANDED))


def test_final_norm_never_read_is_quoted_where_it_is_computed(folder):
    written = "        h = self.final_layer_norm(h)"
    result = _planted(folder, NEOX, "final_norm_unread", ["gpt"],
                      (written, "        normed = self.final_layer_norm(h)"))
    assert _finding(result, "NeoXForCausalLM")[:2] == ("final_norm_missing", _line_of(NEOX, written))


def test_rmsnorm_without_root_quoted_at_its_division_by_a_named_epsilon(folder):
    source = FIXTURES / "learners_hf" / "correct.py"
    written = "return self.weight * hidden_states * torch.rsqrt(variance + self.variance_epsilon)"
    result = _planted(folder, source, "rms_no_sqrt", ["rmsnorm"],
                      (written, "return self.weight * hidden_states / (variance + self.variance_epsilon)"))
    assert _finding(result, "LlamaRMSNorm")[:2] == ("rmsnorm_no_sqrt", _line_of(source, written))


WINDOWED = FIXTURES / "learners_window_zh" / "correct.py"
FAR = "blocked = (dist < 0) | (dist >= self.window)"


def test_window_of_its_config_passes():
    result = check_file(str(WINDOWED), only=["gpt"])
    assert component(result, "WindowGPT").status == "pass", format_report(result)


def test_window_one_too_wide_quotes_the_comparison_with_the_setting(folder):
    """`dist > self.window` where `>=` is meant: each token sees window + 1; the line that compares
    with the setting (`>= self.window`, `<= sliding_window`: an attribute, an operator of two
    characters) is quoted."""
    result = _planted(folder, WINDOWED, "window_too_wide", ["gpt"],
                      (FAR, "blocked = (dist < 0) | (dist > self.window)"))
    assert _finding(result, "WindowGPT")[1] == _line_of(WINDOWED, FAR)
