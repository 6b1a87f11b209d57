"""`handformer check` on learning-rate schedules of the families beyond the paper's and cosine: the
warmup-stable-decay schedule (WSD), its documented variants searched (the warmup from the floor or
from 0, the decay's shape), a planted mistake failing at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy
from helpers import assert_failed_at, statuses

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_schedules"


def test_a_warmup_stable_decay_schedule_passes_with_its_decay_named(tmp_path):
    result = check_file(str(HERE / "wsd_multiplier.py"))
    assert statuses(result) == {"wsd_multiplier": "pass"}, format_report(result)
    assert "half a cosine" in result.components[0].convention["en"]
    early = edited_copy(tmp_path, HERE / "wsd_multiplier.py", [("max(1, num_warmup_steps)",
                                                                "max(1, num_warmup_steps - 1)")])
    assert_failed_at(check_file(early), "schedule_warmup_off_by_one", "")


def test_a_wsd_whose_decay_starts_early_fails_at_that_line(tmp_path):
    late = edited_copy(tmp_path, HERE / "wsd_multiplier.py", [
        ("done = current_step - num_warmup_steps - num_stable_steps", "done = current_step - num_stable_steps")])
    result = check_file(late)
    assert statuses(result) == {"wsd_multiplier": "fail"}, format_report(result)
    assert_failed_at(result, "", "done = current_step - num_stable_steps")
