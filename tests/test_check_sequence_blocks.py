"""`handformer check` on decoder blocks whose forward is written in sequence but whose FFN reads the
block's input instead of the attention's residual sum: they compute a parallel block (x + attn(norm(x))
+ ffn(norm(x)), GPT-J's convention), which check would accept as written so. Two forms (the residual
sum named `h`, then `return h + ffn(norm(x))`; the Hugging Face ports' `residual = residual + attn_output`
with the FFN's output bound to a name first) FAIL quoting the FFN's line; a parallel block as GPT-NeoX
writes it (no residual sum before its second sublayer) passes as the convention."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.result import DEPARTS

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_sequence_blocks"
BLOCKS = {"SumFirstBlock", "ResidualStreamBlock", "ParallelBlock"}


def _checked(name):
    return check_file(str(HERE / f"{name}.py"), only=["block"])


@pytest.fixture(scope="module")
def correct():
    return _checked("correct")


@pytest.fixture(scope="module")
def sum_first_reads_input():
    return _checked("sum_first_reads_input")


@pytest.fixture(scope="module")
def stream_reads_input():
    return _checked("stream_reads_input")


def test_blocks_in_sequence_and_a_parallel_one_pass(correct):
    status = {c.name: c.status for c in correct.components if c.name in BLOCKS}
    assert status == dict.fromkeys(BLOCKS, "pass"), format_report(correct)


@pytest.mark.parametrize(("fixture", "failing", "line"), [("sum_first_reads_input", "SumFirstBlock", 50),
                                                         ("stream_reads_input", "ResidualStreamBlock", 65)])
def test_an_ffn_that_reads_the_input_of_a_block_in_sequence_is_quoted(request, fixture, failing, line):
    result = request.getfixturevalue(fixture)
    status = {c.name: c.status for c in result.components if c.name in BLOCKS}
    assert status == {**dict.fromkeys(BLOCKS, "pass"), failing: "fail"}, format_report(result)
    block = next(c for c in result.components if c.name == failing)
    assert [(f.name, f.line) for f in block.findings] == [(DEPARTS, line)], format_report(result)
    assert not any("a convention" in n["en"] for n in block.notes), format_report(result)
