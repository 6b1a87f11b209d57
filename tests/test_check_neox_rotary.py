"""`handformer check` on GPT-NeoX's rotary module, whose forward(seq_len) returns the cached cos and
sin: inverse frequencies that grow (base ** (2j/d), the reciprocal left out) wrap past pi at position 1,
so they cannot be read back from the table; the table is compared with that mistake's and the mistake
named at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_neox_rotary"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module")
def growing():
    return check_file(str(HERE / "inv_freq_growing.py"))


def test_the_table_passes(correct):
    assert [(c.name, c.status) for c in correct.components] == [("RotaryEmbedding", "pass")], format_report(correct)


def test_growing_frequencies_are_named_at_their_line(growing):
    (rope,) = growing.components
    assert rope.status == "fail", format_report(growing)
    assert [(f.name, f.form, f.line) for f in rope.findings] == [("rope_wrong_base", "positive", 11)], (
        format_report(growing))
