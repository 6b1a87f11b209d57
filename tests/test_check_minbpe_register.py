"""A minbpe-style tokenizer trained without special tokens that registers them afterwards
(`register_special_tokens({text: id})`) and encodes them only when `allowed_special="all"`
(tests/fixtures/learners_minbpe_register/correct.py): check registers two special tokens after
training and grades encode with them allowed; special tokens looked up in the id-keyed table FAIL
at that line."""

from pathlib import Path

import pytest
from check_results import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_minbpe_register" / "correct.py"
WRITTEN, PLANT = "            if part in special:", "            if part in self.specials_by_id:"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(CORRECT))


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return planted_copy(CORRECT, tmp_path_factory.mktemp("minbpe_register"), "planted", (WRITTEN, PLANT))


def test_registered_special_tokens_are_graded(correct):
    (tok,) = correct.components
    assert tok.status == "differs" and all(c.ok for c in tok.checks), format_report(correct)
    assert any(c.name["en"] == "encode (special tokens) gives the reference's ids" for c in tok.checks)


def test_special_tokens_looked_up_by_id_fail_at_the_line(planted):
    (tok,) = planted.components
    assert tok.status == "fail", format_report(planted)
    assert any(f.name == "bpe_special_token_split" and f.code == PLANT.strip() for f in tok.findings)
