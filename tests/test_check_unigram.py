"""A Unigram tokenizer (fixtures/learners_unigram/): pieces with log-probabilities, no merges. Trained on
lines of words, its encode is compared with the highest-scoring segmentation under its own pieces and
scores, and decode must give the text back; its training is not compared. Two forms: a class whose encode
returns pieces (SentencePiece's), and one trained on one string whose encode returns ids. Each passes;
encode taking the longest piece first, and a Viterbi that scores a piece without the best score before
it, fail at the method that searches."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_unigram"
CORRECT = ("pieces_class", "ids_class")
PLANTED = {"pieces_class_longest_first": 30, "ids_class_local_score": 26}  # the line of encode's def


@pytest.fixture(scope="module", params=[*CORRECT, *PLANTED])
def checked(request):
    return request.param, check_file(str(HERE / f"{request.param}.py"))


def test_a_unigram_tokenizer_is_graded_by_its_own_scores(checked):
    name, result = checked
    tok = result.components[-1]
    notes = " ".join(n["en"] for n in tok.notes)
    assert "its EM training (expected counts, the M-step, pruning) is not compared" in notes, notes
    if name in CORRECT:
        assert tok.status == "pass", format_report(result)
        return
    assert tok.status == "fail", format_report(result)
    assert [(f.name, f.line) for f in tok.findings] == [("departs", PLANTED[name])], format_report(result)
