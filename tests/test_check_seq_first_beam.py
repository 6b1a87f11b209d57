"""A beam search over an nn.Transformer kept in its default sequence-first layout (S, N), as
PyTorch's translation tutorial writes it (fixtures/learners_seq_first_beam/correct.py): its source
is handed (S, 1) as its model took it, and the steering reads the model's (T, k) prefixes and
(T, k, V) logits in that layout, so the search passes; a planted mistake fails, named."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_seq_first_beam"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


def test_a_sequence_first_beam_search_passes(correct):
    report = format_report(correct)
    assert {c.name: c.status for c in correct.components} == {
        "TranslationModel": "pass", "beam_search": "pass"}, report


PLANTS = {  # (the edit, the finding's name)
    "not_accumulated": (("cands += [(seq + [t], score + s)", "cands += [(seq + [t], s)"),
                        "beam_scores_not_accumulated"),
    "shortest": (("best = max(done + beams, key=lambda c: c[1])",
                  "best = done[0] if done else max(beams, key=lambda c: c[1])"), "beam_shortest_returned"),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_mistake_fails_and_is_named(tmp_path, plant):
    edit, name = PLANTS[plant]
    result = check_file(edited_copy(tmp_path, HERE / "correct.py", [edit]), only=["beam_search"])
    report = format_report(result)
    failed = [c for c in result.components if c.status == "fail"]
    assert failed and name in [f.name for c in failed for f in c.findings], report
