"""A decoding loop written for a model of the file that check could not build (Medusa-style extra
heads on a base GPT: HeadsModel(base, num_heads)) calls its model with an argument the GPT check
drives it with does not take (`output_orig=True`, written out in a loop that serves one prompt at a
time, or in `**options`): NOT CHECKED with that reason, never FAIL on the TypeError check's choice
of model would raise (tests/fixtures/learners_heads_loop/correct.py)."""

from __future__ import annotations

from pathlib import Path

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_heads_loop" / "correct.py"


def test_loops_written_for_an_unbuilt_model_are_not_checked_with_the_reason():
    result = check_file(str(CORRECT))
    found = {c.name: c for c in result.components}
    assert found["GPT"].status == "pass", format_report(result)
    for name in ("greedy_generate", "generate_text"):  # the argument written out, and in **options
        loop = found[name]
        assert loop.status == "not_checked" and "output_orig" in loop.error.message, format_report(result)
