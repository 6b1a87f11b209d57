"""A mask helper is read in the convention its own file's use says (core/helper_use.py).

A helper that returns True at the padding (WeNet's make_pad_mask(lengths), inverted as the encoder
holds it; a get_pad_mask filled where it holds) and one that returns True at the tokens (filled where
it does not hold) both pass; a helper of lengths is handed each row's number of tokens. A helper whose
True is the tokens while its file fills where it holds FAILs `mask_inverted` at its return, and so does
make_pad_mask turned into a keep mask while its file still inverts it
(tests/fixtures/learners_mask_use/).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy
from helpers import component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = Path(__file__).parent / "fixtures" / "learners_mask_use"
FLIPPED = ("return steps.unsqueeze(0) >= lengths.unsqueeze(1)", "return steps.unsqueeze(0) < lengths.unsqueeze(1)")
# (the helper, the polarity its file's use says)
PASSING = {"pad_true.py": [("make_pad_mask", "masked"), ("get_pad_mask", "masked")],
           "keep_true.py": [("padding_mask", "keep")]}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mask_use")
    paths = {name: str(FOLDER / name) for name in [*PASSING, "keep_filled.py"]}
    paths["flipped"] = edited_copy(folder, FOLDER / "pad_true.py", [FLIPPED])
    return {name: check_file(path, only=["mask_helper"]) for name, path in paths.items()}


@pytest.mark.parametrize("name", PASSING)
def test_each_helper_passes_in_the_convention_its_use_says(results, name):
    for helper, polarity in PASSING[name]:
        c = component(results[name], helper)
        assert c.status == "pass", format_report(results[name])
        assert any(n["en"].startswith("read as your file uses") for n in c.notes)
        assert c.convention["en"].startswith({"masked": "True = masked", "keep": "True (or 1)"}[polarity])


@pytest.mark.parametrize("name, helper, line", [
    ("keep_filled.py", "get_pad_mask", "return (seq != pad_idx).unsqueeze(1)"),
    ("flipped", "make_pad_mask", FLIPPED[1]),
])
def test_a_helper_against_its_files_use_fails_inverted(results, name, helper, line):
    c = component(results[name], helper)
    assert c.status == "fail", format_report(results[name])
    assert [f.name for f in c.findings] == ["mask_inverted"] and line in c.findings[0].code
