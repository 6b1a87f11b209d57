"""Diverse beam searches (fixtures/learners_diverse_beam/): a search that takes groups of beams and a
penalty between them (num_beam_groups and diversity_penalty, num_groups and diversity_strength) is
handed one group and no penalty, where it is the plain beam search, and graded as one, with a note
that the penalty was not checked; its hypotheses are read whether it returns every group's
(score, tokens) or the best (tokens, score)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

HERE = Path(__file__).parent / "fixtures" / "learners_diverse_beam"


@pytest.fixture(scope="module")
def grouped():
    return check_file(str(HERE / "grouped.py"), only=["gpt", "beam_search"])


def test_both_forms_pass_as_the_plain_beam_search(grouped):
    status = {c.name: c.status for c in grouped.components}
    assert status == {"TinyLM": "pass", "diverse_beam_search": "pass", "group_beam_search": "pass"}, \
        format_report(grouped)


def test_the_untested_penalty_is_said(grouped):
    searches = [c for c in grouped.components if c.kind == "beam_search"]
    assert all(any("diversity penalty" in n["en"] for n in c.notes) for c in searches), format_report(grouped)
