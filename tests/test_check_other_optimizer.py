"""A hand-written optimizer that is another algorithm is NOT CHECKED, not FAIL (runners/optimizer.py).

Its update is none of AdamW's under any convention or known mistake, and it takes settings AdamW has
not (a third beta and a mixing weight) or defines train() / eval() (Schedule-Free's swap): NOT CHECKED
naming them. An AdamW that takes torch's own flags (amsgrad) and makes a catalogued mistake still FAILs
named at its line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import component

from handformer.check.core.engine import check_file

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_other_optimizer"
OTHERS = {"swapped.py": ("AveragedSGD", "averaging, train(), eval()"), "three_betas.py": ("MixedAdam", "(mix)")}


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(FIXTURES / name), only=["optimizer"])
            for name in (*OTHERS, "adamw_flagged.py")}


@pytest.mark.parametrize("name", OTHERS)
def test_another_algorithm_is_not_checked_naming_what_adamw_has_not(results, name):
    part, said = OTHERS[name]
    c = component(results[name], part)
    assert c.status == "not_checked" and "is not AdamW" in c.error.message and said in c.error.message, c.error
    assert "不是 AdamW" in c.error.message_zh and not c.findings


def test_an_adamw_taking_torch_flags_still_fails_named(results):
    c = component(results["adamw_flagged.py"], "FlaggedAdamW")
    assert c.status == "fail" and [f.name for f in c.findings] == ["adamw_eps_inside_sqrt"], c
    assert c.findings[0].line == 23
