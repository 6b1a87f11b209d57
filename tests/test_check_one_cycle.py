"""The one-cycle schedule (tests/fixtures/learners_onecycle, a Chinese tutorial's fastai-style
schedule and torch's linear one): both counting conventions pass; the warmup off by one and the
floor left out FAIL, named at their lines."""

import pytest
from check_results import FIXTURES, checked, component, planted_copy, statuses

from handformer.check.core.report import exit_code

SOURCE = FIXTURES / "learners_onecycle" / "correct.py"
PEAK = "    peak_step = pct_start * total_steps - 1\n"
ANNEAL = "return cos_interp(lr_max, lr_end, (pos - pct_start) / (1 - pct_start))"


@pytest.fixture(scope="module")
def correct():
    return checked("learners_onecycle")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onecycle")
    return {"late": planted_copy(SOURCE, folder, "late", (PEAK, PEAK.replace(" - 1", ""))),
            "floor": planted_copy(SOURCE, folder, "floor", (ANNEAL, ANNEAL.replace("lr_end", "0.0")))}


def test_both_conventions_pass(correct):
    assert statuses(correct) == {"one_cycle_schedule": "pass", "linear_one_cycle": "pass"}
    assert exit_code(correct) == 0
    conventions = [component(correct, n).convention["en"] for n in ("one_cycle_schedule", "linear_one_cycle")]
    assert "fastai" in conventions[0] and "OneCycleLR" in conventions[1]


@pytest.mark.parametrize(("plant", "name", "mistake", "quoted"), [
    ("late", "linear_one_cycle", "schedule_warmup_off_by_one", "peak_step = pct_start * total_steps"),
    ("floor", "one_cycle_schedule", "cosine_min_lr_ignored", ANNEAL.replace("lr_end", "0.0"))])
def test_each_plant_fails_named_at_its_line(planted, plant, name, mistake, quoted):
    comp = component(planted[plant], name)
    assert comp.status == "fail"
    assert [(f.name, f.code.strip()) for f in comp.findings] == [(mistake, quoted)]
