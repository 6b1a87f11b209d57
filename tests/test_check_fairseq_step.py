"""A translation step that is handed the decoder's input apart from the target, in two forms
(tests/fixtures/learners_fairseq_step/): fairseq's `train_step(model, optimizer, scheduler, src_tokens,
prev_output_tokens, target, num_updates, epsilon, padding_idx=1)` with its label-smoothed NLL and
`scheduler.step_update(num_updates)`, and `train_step(model, optimizer, src, tgt_in, tgt_out,
pad_id=2)`. check hands the target shifted right as the decoder's input and the next tokens as the
target, its own pad id to the argument that names the pad, and a scheduler that answers fairseq's
calls: both pass, and a step whose decoder is fed the target FAILs."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_fairseq_step"
FED_TARGET = ("fed_target", "split_fed_target")


@pytest.fixture(scope="module")
def checked():
    return {name: check_file(str(HERE / f"{name}.py")) for name in ("correct", "split_target", *FED_TARGET)}


def step_of(result):
    return next(c for c in result.components if c.name == "train_step")


@pytest.mark.parametrize("name", ["correct", "split_target"])
def test_a_step_handed_the_decoders_input_apart_passes(checked, name):
    result = checked[name]
    assert step_of(result).status == "pass", format_report(result)
    assert {c.status for c in result.components} == {"pass"}, format_report(result)


@pytest.mark.parametrize("name", FED_TARGET)
def test_a_decoder_fed_the_target_fails(checked, name):
    result = checked[name]
    assert step_of(result).status == "fail", format_report(result)
