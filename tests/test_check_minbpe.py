"""minbpe's layout (tests/fixtures/learners_minbpe/correct.py): an abstract base Tokenizer, a
BasicTokenizer with no pre-tokenizer, a RegexTokenizer with its own pattern for the `re` module and
special tokens given to its constructor, ties to the smallest pair. The base is no component, each
tokenizer DIFFERS by its tie rule and is graded in full; one planted mistake FAILs at its line."""

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_minbpe" / "correct.py"
PLANTS = {  # name -> (the line as written, the line planted)
    "bpe_encode_merge_order": ('best = min(counts, key=lambda p: self.merges.get(p, float("inf")))',
                               "best = max(counts, key=lambda p: self.merges.get(p, -1))"),
    "bpe_special_token_split": ("if part in self.special_tokens:", "if part in self.inverse_special_tokens:"),
}


@pytest.fixture(scope="module")
def correct():
    return check_file(str(CORRECT))


def test_each_tokenizer_differs_by_its_ties_and_is_graded_in_full(correct):
    by_name = {c.name: c for c in correct.components}
    assert set(by_name) == {"BasicTokenizer", "RegexTokenizer"}, format_report(correct)  # not the base
    for tok in by_name.values():
        assert tok.status == "differs" and len(tok.checks) == 14 and all(c.ok for c in tok.checks)
        assert "smaller pair" in tok.convention["en"]
    assert any("no pre-tokenizer" in n["en"] for n in by_name["BasicTokenizer"].notes)


@pytest.fixture(scope="module", params=sorted(PLANTS))
def planted(request, tmp_path_factory):
    name = request.param
    written, plant = PLANTS[name]
    path = tmp_path_factory.mktemp("minbpe") / f"{name}.py"
    assert written in CORRECT.read_text()
    path.write_text(CORRECT.read_text().replace(written, plant))
    return name, plant, check_file(str(path))


def test_a_planted_mistake_fails_at_its_line(planted):
    name, plant, result = planted
    tok = next(c for c in result.components if c.name == "RegexTokenizer")
    assert tok.status == "fail", format_report(result)
    assert any(f.name == name and f.code == plant for f in tok.findings), format_report(result)
