"""A decoder over an encoder's output is found by its structure, a guess: the tutorial's
Decoder(dec_inputs, enc_inputs, enc_outputs) takes the source ids, not only encoder outputs, and is
not taken for one (never handed a (B, S, D) tensor for its ids); one whose code cannot read check's
encoder output (an object holding its states) is NOT CHECKED, never FAIL. One check run per file."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = Path(__file__).parent / "fixtures" / "learners_memory_guess"


@pytest.fixture(scope="module")
def runs():
    return {name: check_file(str(FOLDER / f"{name}.py")) for name in ("decoder_ids", "memory_object")}


def test_a_decoder_taking_the_source_ids_is_not_driven_as_one_over_encoder_outputs(runs):
    report = runs["decoder_ids"]
    assert not [c for c in report.components if c.status == "fail"], format_report(report)
    assert "memory_decoder" not in {c.kind for c in report.components}, format_report(report)


def test_a_guessed_decoder_that_cannot_read_the_encoder_output_is_not_checked(runs):
    (decoder,) = [c for c in runs["memory_object"].components if c.name == "Decoder"]
    assert decoder.status == "not_checked", format_report(runs["memory_object"])
    assert "guessed its kind" in decoder.error.message, format_report(runs["memory_object"])
