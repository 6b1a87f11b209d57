"""A search whose output length its own code fixes is not compared with one that stops at EOS
(runners/beam.py: _length_locked).

A couplet's beam (a `while` until the output is as long as the source, the special tokens barred) and a
list beam whose shortest and longest lengths are both the source's return exactly as many tokens as
the source in every scenario, never EOS: NOT CHECKED, saying so, never FAIL. The list beam left to run
to the length check hands it, EOS still barred, is no length lock: it FAILs as a beam that never stops
at EOS (tests/fixtures/learners_length_lock/).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy
from helpers import component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = Path(__file__).parent / "fixtures" / "learners_length_lock"
UNLOCKED = ("    min_len = max_len = src.size(1)  # an output as long as its source\n", "    min_len = max_len\n")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    paths = {name: str(FOLDER / name) for name in ("couplet.py", "same_length.py")}
    paths["unlocked"] = edited_copy(tmp_path_factory.mktemp("lock"), FOLDER / "same_length.py", [UNLOCKED])
    return {name: check_file(path, only=["beam_search"]) for name, path in paths.items()}


@pytest.mark.parametrize("name", ["couplet.py", "same_length.py"])
def test_a_length_locked_search_is_not_checked(results, name):
    c = component(results[name], "beam_search")
    assert c.status == "not_checked" and not c.findings, format_report(results[name])
    assert "as many tokens as the source holds (6)" in c.error.message and "锁定长度" in c.error.message_zh


def test_a_search_that_runs_on_without_eos_still_fails(results):
    c = component(results["unlocked"], "beam_search")
    assert c.status == "fail", format_report(results["unlocked"])
