"""`handformer check` on text-level generation loops, driven with a tokenizer whose text is one character
a token: a generator function that yields the text of each new token (iterated, its pieces joined), and
a `generate` that joins what its streaming helper yields (stop strings held back). Each is read back as
the tokens it generated and graded as the loop it is; a planted mistake fails named at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILY = Path(__file__).parent / "fixtures" / "learners_text_stream"
GREEDY = "1 prompt, 4 new tokens: the tokens of handformer's greedy decoding"


@pytest.fixture(scope="module", params=["yielded", "joined"])
def correct(request):
    return check_file(str(FAMILY / f"{request.param}.py"), only=["generate"])


@pytest.fixture(scope="module", params=[
    ("yielded_temperature_multiplied", "temperature_multiplied", 11, "* temperature"),
    ("joined_not_appended", "generate_not_appended", 17, "torch.cat([ids, next_id], dim=1)")])
def planted(request):
    file, name, line, code = request.param
    return check_file(str(FAMILY / f"{file}.py"), only=["generate"]), name, line, code


def test_a_text_stream_is_read_back_as_its_tokens_and_passes(correct):
    assert [c.status for c in correct.components] == ["pass"], format_report(correct)
    assert [c.ok for c in correct.components[0].checks if c.name["en"].startswith(GREEDY)] == [True]


def test_a_planted_text_stream_fails_named_at_its_line(planted):
    result, name, line, code = planted
    loop = result.components[0]
    assert [c.status for c in result.components] == ["fail"], format_report(result)
    assert [(f.name, f.line) for f in loop.findings] == [(name, line)]
    assert code in loop.findings[0].code
