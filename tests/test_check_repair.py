"""`check` quotes the line a mistake is made on, found by repairing it (handformer/check/core/repair.py):
a FAIL that no catalogued mistake names, in an optimizer, an attention module and a free function
(GAE), quotes the one line whose single edit makes the component match the reference, and says the
edit; the correct files pass, no repair run."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core import repair
from handformer.check.core.engine import check_file
from handformer.check.core.result import DEPARTS, FAIL, PASS

pytestmark = pytest.mark.usefixtures("one_thread")

FOLDER = Path(__file__).parent / "fixtures" / "learners_repair"

# file -> (the planted line, the edit said: its text in place of the planted text)
PLANTS = {
    "adamw_decay_swapped.py": (37, "`group['eps'], group['weight_decay']` in place of "
                                   "`group['weight_decay'], group['eps']`"),
    "attention_scale_inverted.py": (20, "`-0.5` in place of `0.5`"),
    "gae_sign.py": (19, "`+` in place of `-`"),
    "gae_next_is_previous.py": (10, "`[1:]` in place of `[:-1]`"),
}
CORRECT = ("adamw_correct.py", "attention_correct.py", "gae_correct.py")


@pytest.fixture(scope="module")
def results() -> dict[str, object]:
    with pytest.MonkeyPatch.context() as mp:  # the CPU budget alone: the same repairs on a busy machine
        mp.setattr(repair, "WALL", 120.0)
        mp.setattr(repair, "LATE", 120.0)
        return {name: check_file(str(FOLDER / name)).components[0] for name in [*PLANTS, *CORRECT]}


@pytest.mark.parametrize("name", PLANTS)
def test_a_mistake_no_name_explains_is_quoted_at_the_line_whose_repair_matches(results, name):
    line, edit = PLANTS[name]
    res = results[name]
    assert res.status == FAIL  # a repair names the line; it never passes the component
    [finding] = res.findings
    assert (finding.name, finding.line) == (DEPARTS, line), finding
    assert f"line {line}: with {edit} it matches the reference" in finding.observed["en"]
    assert f"第 {line} 行：把" in finding.observed["zh"]


def test_the_repair_keeps_where_the_difference_shows_and_its_form(results):
    said = results["attention_scale_inverted.py"].findings[0].observed["en"]
    assert "; the first step that parts from the reference is `scores` at line 11" in said
    assert "a constant factor 4 = d_k" in said
    assert not any("NaN" in note["en"] for note in results["attention_scale_inverted.py"].notes)  # repairs' own


@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_file_passes_without_findings(results, name):
    assert (results[name].status, results[name].findings) == (PASS, [])


def test_no_repair_runs_on_a_component_that_passes_or_names_its_mistake(monkeypatch):
    def tried(*args: object) -> list[object]:
        raise AssertionError("a repair ran")

    monkeypatch.setattr(repair, "_matching", tried)
    for res in (repair.ComponentResult("gae", "f", PASS),
                repair.ComponentResult("gae", "f", FAIL, findings=[repair.Finding("no_scaling", {}, 3)])):
        repair.repaired(res, None, None, lambda comp: PASS)


def test_an_edit_is_said_where_the_two_texts_differ():
    assert repair.differing("f(p, lr, beta2, beta1)", "f(p, lr, beta1, beta2)") == ("beta2, beta1", "beta1, beta2")
    assert repair.differing("a + b", "a") == ("a + b", "a")  # a cut that leaves nothing: whole


def test_of_several_lines_that_repair_it_the_one_that_makes_the_difference_is_kept():
    order = {20: 0, 11: 5, 33: 1, 35: 2}.copy
    assert repair._made_at({11, 20}, 11, order) == {20}  # read by the departing line: made above
    assert repair._made_at({33, 35}, 33, order) == {33}  # undone below where it shows: not there
    assert repair._made_at({26, 36}, None, order) == {26, 36}  # nothing shows where: both, not said
