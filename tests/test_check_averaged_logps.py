"""`handformer check` on sequence log-probability helpers that sum by default and average when a switch
asks (`average_log_prob=False`, `length_normalize=False`), in two forms: a trainer's static method that
reads -100 as not counted, and a free function handed a loss mask. The switch is driven on too, on the
same padded labels: an average over the row's length instead of its counted labels is quoted at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.result import DEPARTS

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_averaged_logps"
HELPERS = {"PairTrainer.get_batch_logps": "average_log_prob", "get_sequence_logps": "length_normalize"}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(HERE / f"{name}.py"))
            for name in ("correct", "method_full_length", "function_full_length")}


def test_both_helpers_pass_summed_and_averaged(results):
    result = results["correct"]
    helpers = {c.name: c for c in result.components}
    assert {name: c.status for name, c in helpers.items()} == dict.fromkeys(HELPERS, "pass"), format_report(result)
    for name, switch in HELPERS.items():
        assert any(check.name["en"].startswith(f"{switch}=True") and check.ok for check in helpers[name].checks)


@pytest.mark.parametrize(("plant", "failing", "line"), [("method_full_length", "PairTrainer.get_batch_logps", 17),
                                                       ("function_full_length", "get_sequence_logps", 27)])
def test_an_average_over_the_length_is_quoted_at_its_line(results, plant, failing, line):
    result = results[plant]
    status = {c.name: c.status for c in result.components}
    assert status == {**dict.fromkeys(HELPERS, "pass"), failing: "fail"}, format_report(result)
    helper = next(c for c in result.components if c.name == failing)
    assert [(f.name, f.line) for f in helper.findings] == [(DEPARTS, line)], format_report(result)
