"""Learner files in styles the grader met on held-out sets: AdamW written by hand (a plain class, and
CS336's torch.optim.Optimizer), fairseq's training pieces (inverse_sqrt schedules, a label-smoothed
criterion that sums, a step that divides by the real tokens), mask helpers under other tutorials'
names, and an attention function that reads d_k from the wrong axis. One check run per file, shared
by its asserts; the AdamW plants are tests/check_plants.py's (tests/test_check.py names each)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

FIXTURES = Path(__file__).parent / "fixtures"


def _run(path: Path, only: list[str] | None = None):
    result = check_file(str(path), only=only)
    return result, {c.name: c for c in result.components}, format_report(result)


@pytest.fixture(scope="module")
def adamw():
    return _run(FIXTURES / "learners_adamw" / "correct.py")


@pytest.fixture(scope="module")
def cs336():
    return _run(FIXTURES / "learners_adamw" / "cs336_adamw.py")


def test_a_hand_written_adamw_is_graded_and_passes(adamw):
    result, comps, report = adamw
    assert exit_code(result) == 0, report
    assert comps["AdamW"].kind == "optimizer" and comps["AdamW"].status == "pass", report
    assert "torch.optim.AdamW" in comps["AdamW"].convention["en"], report


def test_cs336s_adamw_passes_in_its_own_order_of_decay_and_eps(cs336):
    result, comps, report = cs336
    assert exit_code(result) == 0 and comps["AdamW"].status == "pass", report
    assert "CS336's algorithm" in comps["AdamW"].convention["en"], report


@pytest.fixture(scope="module")
def fairseq():
    return {name: _run(FIXTURES / "learners_fairseq" / f"{name}.py")
            for name in ("correct", "decay_off_by_one", "warmup_exponent")}


def test_fairseqs_training_pieces_pass(fairseq):
    result, comps, report = fairseq["correct"]
    assert exit_code(result) == 0, report
    assert {n: c.status for n, c in comps.items()} == {
        "lr_lambda": "pass", "inverse_sqrt_lr": "pass", "get_lr": "pass",
        "LabelSmoothedCrossEntropyCriterion": "pass", "train_step": "pass"}, report
    assert "fairseq's warmup_init_lr" in comps["get_lr"].convention["en"], report


@pytest.mark.parametrize(("plant", "name", "line"), [
    ("decay_off_by_one", "get_lr", "line 28: return lr * math.sqrt(warmup_updates / (num_updates + 1))"),
    ("warmup_exponent", "inverse_sqrt_lr", "line 21: return base_lr * min(step ** -0.5, step * warmup ** -0.5)")])
def test_a_fairseq_schedule_with_a_mistake_fails_at_its_line(fairseq, plant, name, line):
    result, comps, report = fairseq[plant]
    assert exit_code(result) == 1 and comps[name].status == "fail", report
    assert [c.name for c in result.components if c.status == "fail"] == [name], report
    assert line in report, report


@pytest.fixture(scope="module")
def masks():
    return {name: _run(FIXTURES / "learners_mask_names" / f"{name}.py", ["causal_mask", "mask_helper"])
            for name in ("correct", "subsequent_no_self", "decoder_sees_next")}


def test_mask_functions_are_found_by_what_their_code_computes(masks):
    result, comps, report = masks["correct"]
    assert exit_code(result) == 0, report
    assert {n: c.kind for n, c in comps.items()} == {
        "make_subsequent_mask": "causal_mask", "get_subsequent_mask": "causal_mask", "future_mask": "causal_mask",
        "make_decoder_mask": "mask_helper", "make_encoder_mask": "mask_helper"}, report
    assert "by what its code computes" in report, report


@pytest.mark.parametrize(("plant", "name", "line"), [
    ("subsequent_no_self", "make_subsequent_mask", "line 11:"), ("decoder_sees_next", "make_decoder_mask", "line 23:")])
def test_a_mask_function_found_so_fails_at_its_line(masks, plant, name, line):
    result, comps, report = masks[plant]
    assert [c.name for c in result.components if c.status == "fail"] == [name], report
    finding = comps[name].findings[0]
    assert finding.name == "causal_off_by_one" and f"line {finding.line}:" == line, report


@pytest.mark.parametrize(("name", "status"), [("correct", "pass"), ("query_size_one", "fail")])
def test_an_attention_function_is_checked_at_sizes_all_apart(name, status):
    """B, H, T, d_k and B * H all differ, and a function that takes a batch of heads is not read one
    head at a time: d_k read as query.size(1) (the heads) fails at its line."""
    result, comps, report = _run(FIXTURES / "learners_axes" / f"{name}.py", ["sdpa"])
    assert comps["attention"].status == status, report
    assert ("line 10: d_k = query.size(1)" in report) == (status == "fail"), report


@pytest.fixture(scope="module")
def update_count():
    return {name: _run(FIXTURES / "learners_fairseq" / f"{name}.py", ["train_step"])
            for name in ("update_count", "update_count_counts_padding")}


def test_a_step_that_takes_its_update_count_is_driven_with_it(update_count):
    """train_step(model, optimizer, src, tgt, step): handed 1, then 2; the rate it sets after its update
    (the next step's) read back, its tiny first rates compared at a tolerance scaled with them; fairseq's
    (loss, nll_loss) read as its loss."""
    result, comps, report = update_count["update_count"]
    assert exit_code(result) == 0 and comps["train_step"].status == "pass", report
    assert "update count (step: 1, then 2), after its update" in report, report


def test_a_step_with_its_update_count_that_counts_padding_fails(update_count):
    result, comps, report = update_count["update_count_counts_padding"]
    assert comps["train_step"].status == "fail", report


def test_adam_without_weight_decay_is_compared_with_no_decay():
    result, comps, report = _run(FIXTURES / "learners_adamw" / "adam_no_decay.py", ["optimizer"])
    assert comps["Adam"].status == "pass" and "weight_decay 0)" in report, report


@pytest.mark.parametrize(("name", "mistake", "line"), [
    ("correct", None, None), ("eps_inside_sqrt", "adamw_eps_inside_sqrt", 27), ("beta2_for_m", "adamw_beta2_for_m", 22)])
def test_a_step_that_writes_adamw_inside_is_graded(name, mistake, line):
    """train_step(model, x, y, state, t, lr, betas, eps, weight_decay): no optimizer handed, its state
    built by the file's init_adam_state(model), the count from 1; a plant is named at its line."""
    result, comps, report = _run(FIXTURES / "learners_adamw_step" / f"{name}.py")
    comp = comps["train_step"]
    assert comp.kind == "adam_step" and comp.status == ("fail" if mistake else "pass"), report
    assert [(f.name, f.line) for f in comp.findings] == ([(mistake, line)] if mistake else []), report
