"""A translation step that is handed the decoder's input apart from the target, in two forms
(tests/fixtures/learners_fairseq_step/): fairseq's `train_step(model, optimizer, scheduler, src_tokens,
prev_output_tokens, target, num_updates, epsilon, padding_idx=1)` with its label-smoothed NLL and
`scheduler.step_update(num_updates)`, and `train_step(model, optimizer, src, tgt_in, tgt_out,
pad_id=2)`. check hands the target shifted right as the decoder's input and the next tokens as the
target, its own pad id to the argument that names the pad, and a scheduler that answers fairseq's
calls: both pass, and a step whose decoder is fed the target FAILs. fairseq's scheduler classes, built
on the optimizer and stepped by `step_update(num_updates)`, are read so too (two forms); one whose
decay forgets the warmup's factor FAILs."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_fairseq_step"
FED_TARGET = ("fed_target", "split_fed_target")


@pytest.fixture(scope="module")
def checked():
    names = ("correct", "split_target", "sqrt_class", "decay_without_warmup", *FED_TARGET)
    return {name: check_file(str(HERE / f"{name}.py")) for name in names}


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


@pytest.mark.parametrize("name", ["correct", "sqrt_class"])
def test_a_scheduler_stepped_by_its_update_count_passes(checked, name):
    result = checked[name]
    schedule = next(c for c in result.components if c.kind == "schedule")
    assert schedule.status == "pass", format_report(result)


def test_a_decay_without_the_warmups_factor_fails(checked):
    result = checked["decay_without_warmup"]
    schedule = next(c for c in result.components if c.kind == "schedule")
    assert schedule.status == "fail", format_report(result)
