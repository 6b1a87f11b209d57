"""A class that raises on check's input but runs in the file's own demo is NOT CHECKED, not FAIL
(core/own_demo.py): a block over a residual stream of n copies (B, T, n, C), an attention that takes
sequences of whole chunks (T % 6 == 0 in its config). The same file with a line that raises on the
demo's own input too still FAILs with the exception at that line. A GPT whose forward, handed labels,
gives back one loss a token and no logits (Megatron's) is compared on the logits it gives without them."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from helpers import component, planted_copy

from handformer.check.core.engine import check_file

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures" / "learners_own_demo"
PLANTS = {  # (source, edit, the class that raises, the line it raises at)
    "streams_broken": ("streams.py", ('x = torch.einsum("btnc,n->btc", h, self.mix)',
                                      'x = torch.einsum("btnc,c->btc", h, self.mix)'), "Block", 48),
    "chunked_broken": ("chunked.py", ("T // self.chunk, self.chunk, hd)", "T // self.chunk, self.chunk + 1, hd)"),
                       "Transformer", 34),
}
CORRECT = {"streams.py": ("Block", "(2, 11, 3, 32) float32"), "chunked.py": ("Transformer", "(2, 12) int64")}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """name -> its FileResult, each file checked once, when a test first asks for it."""
    folder = tmp_path_factory.mktemp("own_demo")

    @functools.cache
    def result(name):
        if name in PLANTS:
            source, edit = PLANTS[name][:2]
            return check_file(planted_copy(folder, name, FIXTURES / source, edit), only=["block", "gpt"])
        if name == "per_token":
            return check_file(str(FIXTURES.parent / "learners_losses_alone" / "per_token.py"), only=["gpt"])
        return check_file(str(FIXTURES / name), only=["block", "gpt"])
    return result


@pytest.mark.parametrize("name", CORRECT)
def test_a_class_its_own_demo_runs_is_not_charged_for_checks_input(results, name):
    part, given = CORRECT[name]
    c = component(results(name), part)
    assert c.status == "not_checked" and "your own demo" in c.error.message and given in c.error.message, c
    assert "演示代码" in c.error.message_zh and not c.findings


@pytest.mark.parametrize("name", PLANTS)
def test_a_class_that_raises_on_its_demos_input_too_still_fails(results, name):
    part, line = PLANTS[name][2:]
    c = component(results(name), part)
    assert c.status == "fail" and c.error is not None and c.error.kind == "exception", c
    assert any(f"line {line}" in t for t in c.error.traceback), c.error.traceback


def test_a_gpt_that_gives_losses_alone_for_labels_is_compared_on_its_logits(results):
    c = component(results("per_token"), "GPT")
    assert c.status == "pass" and all(check.ok for check in c.checks), c.checks
