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


def test_a_scheduler_class_with_a_switch_of_timms_countings_passes_and_without_it_fails(tmp_path):
    result = check_file(str(HERE / "warmup_cosine_class.py"))
    assert statuses(result) == {"WarmupCosineLR": "pass"}, format_report(result)
    assert "warmup_prefix=False" in result.components[0].convention["en"]
    # no switch to the other counting: a cosine counted from step 0 is the mistake again
    fixed = edited_copy(tmp_path, HERE / "warmup_cosine_class.py", [
        ("min_lr=0.0, decay_after_warmup=False", "min_lr=0.0"),
        ("self.decay_after_warmup = decay_after_warmup", "self.decay_after_warmup = False")])
    assert_failed_at(check_file(fixed), "cosine_from_step_zero", "")


def test_plants_in_a_timm_counting_fail_the_named_one_at_its_line(tmp_path):
    no_floor = edited_copy(tmp_path, HERE / "warmup_cosine_class.py", [
        ("self.min_lr + (peak - self.min_lr) * (1 + math", "peak * (1 + math")])
    result = check_file(no_floor)
    assert_failed_at(result, "cosine_min_lr_ignored", "")
    assert [f.code for c in result.components for f in c.findings] == [
        "return peak * (1 + math.cos(math.pi * step / self.total_steps)) / 2"], format_report(result)
    slow = edited_copy(tmp_path, HERE / "warmup_cosine_class.py", [("return peak * step / self.warmup_steps",
                                                                   "return peak * step / self.total_steps")])
    assert statuses(check_file(slow)) == {"WarmupCosineLR": "fail"}


def test_an_optimizer_wrapper_that_counts_its_steps_is_read_as_a_schedule(tmp_path):
    result = check_file(str(HERE / "noam_opt_wrapper.py"))
    assert statuses(result) == {"NoamOpt": "pass"}, format_report(result)
    flipped = edited_copy(tmp_path, HERE / "noam_opt_wrapper.py", [("self.warmup ** (-1.5)", "self.warmup ** (1.5)")])
    result = check_file(flipped)
    assert_failed_at(result, "schedule_exponent_sign", "")
    assert "step * self.warmup ** (1.5)" in result.components[0].findings[0].code, format_report(result)
