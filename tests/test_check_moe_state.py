"""A mixture of experts that departs from the reference while its output reads a tensor no expert,
router weight or shared expert holds (DeepSeek-V3's selection-only expert bias, a buffer) is NOT
CHECKED with that tensor named, never FAIL. A running count that only training writes is not read by
the output: such a mixture is graded as any other, its planted mistakes (named, or where it departs)
FAIL."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_moe_state"
NAMES = ("selection_bias", "load_counter", "load_counter_not_renormalized", "load_counter_mean")


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"), only=["moe"]) for name in NAMES}


def _moe(results, name):
    return next(c for c in results[name].components if c.kind == "moe")


def test_a_selection_only_bias_is_not_checked_and_named(results):
    comp = _moe(results, "selection_bias")
    assert comp.status == "not_checked", format_report(results["selection_bias"])
    assert "choice_bias (4,)" in comp.error.message and "choice_bias (4,)" in comp.error.message_zh
    assert "line 29" in comp.error.message and "第 29 行" in comp.error.message_zh


def test_a_count_training_alone_writes_is_graded(results):
    comp = _moe(results, "load_counter")
    assert comp.status == "pass" and not comp.error, format_report(results["load_counter"])


@pytest.mark.parametrize("name, finding", [("load_counter_not_renormalized", ("moe_weights_not_renormalized", 28)),
                                           ("load_counter_mean", ("departs", 33))])
def test_a_planted_mistake_beside_the_count_fails(results, name, finding):
    comp = _moe(results, name)
    assert comp.status == "fail", format_report(results[name])
    assert (comp.findings[0].name, comp.findings[0].line) == finding
