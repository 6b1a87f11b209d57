"""`handformer check` on rotary functions that build their own angles from their positions, taken under
a name of their own: apply_rope(x, pos, base) and apply_rotary_emb(x, positions) (an int tensor of
positions), apply_rotary(x, shift) (where they start). The one required argument beside the tensors is
found by what it accepts, the offset checked, a wrong exponent and an offset left out named at their line,
an uncatalogued sign quoted in the learner's own file (not the grader's wrapper that names its positions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_rope_positions"
FILES = ("correct", "positions_interleaved", "shift", "exponent_by_one", "shift_ignored", "odd_turned_back",
         "length_argument")


@pytest.fixture(scope="module")
def reports():
    return {name: check_file(str(HERE / f"{name}.py")) for name in FILES}


@pytest.mark.parametrize("name", FILES[:3])
def test_positions_under_any_name_are_found_and_the_offset_checked(reports, name):
    (rope,) = reports[name].components
    assert rope.status == "pass", format_report(reports[name])
    assert any("offset" in c.name["en"] and c.ok for c in rope.checks), format_report(reports[name])


@pytest.mark.parametrize(("name", "mistake", "line"), [("exponent_by_one", "rope_wrong_base", 14),
                                                       ("shift_ignored", "rope_no_offset", 9)])
def test_a_planted_mistake_is_named_at_its_line(reports, name, mistake, line):
    (rope,) = reports[name].components
    assert rope.status == "fail", format_report(reports[name])
    assert [(f.name, f.line) for f in rope.findings] == [(mistake, line)], format_report(reports[name])


def test_an_uncatalogued_mistake_is_quoted_in_the_learners_file(reports):
    (rope,) = reports["odd_turned_back"].components
    assert rope.status == "fail", format_report(reports["odd_turned_back"])
    # the stacked pair (line 12) is compared once flattened, at its return (line 13)
    assert [f.line for f in rope.findings] == [13], format_report(reports["odd_turned_back"])
    assert "out.flatten" in format_report(reports["odd_turned_back"])


def test_a_length_argument_is_not_taken_for_positions(reports):
    # apply_rotary(x, seq_len): a length, never handed positions (its own error would read as a failure)
    (rope,) = reports["length_argument"].components
    assert rope.status == "not_checked", format_report(reports["length_argument"])
