"""A WordPiece tokenizer's encoders graded on the vocabulary its pieces come from
(tests/fixtures/learners_wordpiece_encoded/): beside a trainer of free functions, a helper that cuts a
text into words with no vocabulary (basic_tokenize) is no encoder of the pieces trained, and an
encoding that holds its ids beside other fields (a dict's input_ids, an Encoding's .ids) is read by
its ids. Each correct file PASSes; each plant FAILs named at its line (a pair score over the sum
of its parts' frequencies among them)."""

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FIXTURES = Path(__file__).parent / "fixtures" / "learners_wordpiece_encoded"
PLANTS = {"trainer_shortest": ("wordpiece_shortest_match", "end += 1"),
          "encoding_unk_piece": ("wordpiece_unk_piece", "return out + [self.unk_token]"),
          "trainer_sum_score": ("wordpiece_pair_score", "score = n / (single[a] + single[b])")}


@pytest.fixture(scope="module", params=["trainer", "encoding", *PLANTS])
def checked(request):
    return request.param, check_file(str(FIXTURES / f"{request.param}.py"))


def test_encoders_are_graded_on_the_vocabulary_and_the_ids_of_an_encoding(checked):
    name, result = checked
    (tok,) = result.components
    graded = " ".join(c.name["en"] for c in tok.checks)
    assert "encode gives the reference's pieces" in graded, format_report(result)
    assert "basic_tokenize" not in graded, format_report(result)
    if name not in PLANTS:
        assert tok.status == "pass", format_report(result)
        return
    assert tok.status == "fail" and [(f.name, f.code) for f in tok.findings] == [PLANTS[name]], \
        format_report(result)
