"""`handformer check` on a RoFormer-style encoder: apply_rotary_position_embeddings(sinusoidal_pos,
query_layer, key_layer) takes one table of the sines then the cosines, which its code splits and
repeats pair by pair; the model (a ...Model of BERT's family, by its token types) builds Hugging Face's
additive mask, (1 - mask) * finfo.min. The rotation and the model's padding are checked: the queries
alone turned the other way is named and quoted, a table repeated as halves parts at its line, and the
mask built the wrong way round is named at the line that builds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_roformer"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


@pytest.fixture(scope="module")
def query_turned_back():
    return check_file(str(HERE / "query_turned_back.py"), only=["rope"])


@pytest.fixture(scope="module")
def halves_table():
    return check_file(str(HERE / "halves_table.py"), only=["rope"])


@pytest.fixture(scope="module")
def mask_flipped():
    return check_file(str(HERE / "mask_flipped.py"), only=["encoder_model"])


def test_the_rotation_and_the_model_are_checked_and_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"RoFormerSelfAttention": "pass", "apply_rotary_position_embeddings": "pass",
                      "RoFormerLayer": "pass", "RoFormerModel": "pass"}, format_report(correct)


def test_the_queries_alone_turned_the_other_way_are_named_at_their_line(query_turned_back):
    (rope,) = query_turned_back.components
    assert rope.status == "fail", format_report(query_turned_back)
    (finding,) = rope.findings
    assert (finding.name, finding.line) == ("rope_rotation_sign", 45), format_report(query_turned_back)


def test_a_table_repeated_as_halves_parts_at_its_line(halves_table):
    (rope,) = halves_table.components
    assert rope.status == "fail", format_report(halves_table)
    assert [f.line for f in rope.findings] == [38], format_report(halves_table)


def test_the_model_whose_mask_hides_the_real_tokens_is_named_at_the_line_that_builds_it(mask_flipped):
    (model,) = mask_flipped.components
    assert model.status == "fail", format_report(mask_flipped)
    assert [(f.name, f.line) for f in model.findings] == [("mask_inverted", 107)], format_report(mask_flipped)
