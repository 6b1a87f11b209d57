"""Tokenizers built with nothing (fixtures/learners_fixed_tokenizer/): a byte tokenizer with Meta's
encode(s, bos, eos) and a code-point one with encode(text, add_bos=False, add_eos=False) have no
vocabulary or merges check could hand them; each must give its texts back and put its own BOS and EOS
ids where its flags say. The EOS flag that appends the BOS id fails at that line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_fixed_tokenizer"


@pytest.fixture(scope="module", params=["byte_flags.py", "code_points.py"])
def right(request):
    return check_file(str(HERE / request.param), only=["bpe_tokenizer"])


@pytest.fixture(scope="module")
def eos_wrong():
    return check_file(str(HERE / "code_points_eos_wrong.py"), only=["bpe_tokenizer"])


def test_a_tokenizer_built_with_nothing_passes_on_what_any_tokenizer_must_do(right):
    (tok,) = right.components
    assert tok.status == "pass" and len(tok.checks) == 3, format_report(right)


def test_the_eos_flag_that_appends_another_id_fails_at_its_line(eos_wrong):
    (tok,) = eos_wrong.components
    assert tok.status == "fail" and [f.line for f in tok.findings] == [17], format_report(eos_wrong)


@pytest.mark.parametrize("name, status", [("char_vocab.py", "pass"), ("char_vocab_decode_short.py", "fail")])
def test_an_encode_function_over_a_character_vocabulary_is_graded_on_its_own_characters(name, status):
    """A free encode(s) that reads a vocabulary of single characters (no merges) is no BPE: it is handed
    texts spelled from its own characters (check's texts hold characters it has no id for) and must
    give them back through the file's decode."""
    report = check_file(str(HERE / name), only=["bpe_tokenizer"])
    (tok,) = report.components
    assert tok.status == status and "character vocabulary" in tok.notes[0]["en"], format_report(report)
