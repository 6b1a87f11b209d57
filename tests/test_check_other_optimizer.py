"""A hand-written optimizer that is another algorithm is NOT CHECKED, not FAIL (runners/optimizer.py).

Its update is none of AdamW's under any convention or known mistake, and it takes settings AdamW has
not (a third beta and a mixing weight) or defines train() / eval() (Schedule-Free's swap): NOT CHECKED
naming them. One whose settings are AdamW's alone (ADOPT, AdaBelief) is NOT CHECKED too, never FAIL
unlocated: the report names the form of its departure, the step where it parts and a first step that
moves nothing. An AdamW that takes torch's own flags (amsgrad) and makes a catalogued mistake still
FAILs named at its line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import component

from handformer.check.core.engine import check_file

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_other_optimizer"
OTHERS = {"swapped.py": ("AveragedSGD", "averaging, train(), eval()"), "three_betas.py": ("MixedAdam", "(mix)")}
# (the class, how its departure is said): settings AdamW has, an update it has not
DEPARTING = {"adopt.py": ("ADOPT", "at step 1 of 3; its first step leaves the parameters where they were"),
             "belief.py": ("AdaBelief", "at step 1 of 3)")}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(FIXTURES / name), only=["optimizer"])
            for name in (*OTHERS, *DEPARTING, "adamw_flagged.py")}


@pytest.mark.parametrize("name", OTHERS)
def test_another_algorithm_is_not_checked_naming_what_adamw_has_not(results, name):
    part, said = OTHERS[name]
    c = component(results[name], part)
    assert c.status == "not_checked" and "is not AdamW" in c.error.message and said in c.error.message, c.error
    assert "不是 AdamW" in c.error.message_zh and not c.findings


@pytest.mark.parametrize("name", DEPARTING)
def test_an_update_none_of_adamws_is_not_checked_naming_its_departure(results, name):
    part, said = DEPARTING[name]
    c = component(results[name], part)
    assert c.status == "not_checked" and said in c.error.message and not c.findings, c
    assert "what AdamW has not" not in c.error.message and "从步骤 1 起与 AdamW 不同" in c.error.message_zh


def test_an_adamw_taking_torch_flags_still_fails_named(results):
    c = component(results["adamw_flagged.py"], "FlaggedAdamW")
    assert c.status == "fail" and [f.name for f in c.findings] == ["adamw_eps_inside_sqrt"], c
    assert c.findings[0].line == 23
