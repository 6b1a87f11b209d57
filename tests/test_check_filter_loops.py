"""`handformer check` on sampling loops that take a top-k or a top-p, each in two forms.

Top-k: a model's own generate() that thresholds at the k-th largest logit (nanoGPT's), and a free
function that ranks the logits with a sort and keeps them with torch.where. The runs at top_k = 1 see a
model whose likeliest token is certain, which hides a filter that keeps the wrong tokens; the loop is
driven once more at top_k = 5 on its model's logits as they are, and a filter that keeps other tokens is
quoted at its line.
Top-p: a model's own generate() that removes the sorted tokens whose cumulative probability passes p and
shifts the removal right (the Hugging Face ports'), and a free function that zeroes the sorted
probabilities whose mass ranked above passes p (Meta's sample_top_p). Driven at top_p = 0.6, a loop that
keeps another count than the nucleus, in no catalogued form, is quoted at the line that compares the
cumulative mass with p."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.result import DEPARTS
from handformer.check.runners.generate_top_k import filter_line
from handformer.check.runners.generate_top_p import mass_line

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
# the filter -> its fixture folder, its two loops, the check the correct loops pass, what a finding says
FILTERS = {"top_k": ("learners_top_k_loops", {"PocketLM.generate", "sample_with_top_k"}, "top_k=5",
                     "top-k keeps"),
           "top_p": ("learners_top_p_loops", {"NucleusLM.generate", "nucleus_decode"}, "top_p=0.6",
                     "nucleus holds")}
# (filter, planted file, the loop that fails, the line its finding quotes)
PLANTS = [("top_k", "method_inverted", "PocketLM.generate", 33),
          ("top_k", "function_inverted", "sample_with_top_k", 46),
          ("top_p", "method_reversed", "NucleusLM.generate", 35),
          ("top_p", "function_reversed", "nucleus_decode", 52)]


@pytest.fixture(scope="module")
def checked():
    """(filter, file name) -> its check result, each file checked once for the module."""
    runs = {}

    def run(kind, name):
        if (kind, name) not in runs:
            runs[kind, name] = check_file(str(FIXTURES / FILTERS[kind][0] / f"{name}.py"), only=["generate"])
        return runs[kind, name]
    return run


@pytest.mark.parametrize("kind", FILTERS)
def test_both_loops_keep_what_the_filter_keeps_and_pass(checked, kind):
    _, names, probe, _ = FILTERS[kind]
    result = checked(kind, "correct")
    loops = {c.name: c for c in result.components if c.name in names}
    assert {name: c.status for name, c in loops.items()} == dict.fromkeys(names, "pass"), format_report(result)
    assert all(any(probe in check.name["en"] and check.ok for check in c.checks)
               for c in loops.values()), format_report(result)


@pytest.mark.parametrize(("kind", "name", "failing", "line"), PLANTS)
def test_a_filter_that_keeps_other_tokens_is_quoted_at_its_line(checked, kind, name, failing, line):
    _, names, _, said = FILTERS[kind]
    result = checked(kind, name)
    status = {c.name: c.status for c in result.components if c.name in names}
    assert status == {**dict.fromkeys(names, "pass"), failing: "fail"}, format_report(result)
    loop = next(c for c in result.components if c.name == failing)
    assert [(f.name, f.line) for f in loop.findings] == [(DEPARTS, line)], format_report(result)
    assert said in loop.findings[0].observed["en"], format_report(result)


def test_the_filter_line_is_the_first_write_after_the_ranking():
    lines = [(1, "    v, _ = torch.topk(logits, k)"), (2, "    # logits[...] = -inf"),
             (3, "    cut = v[:, -1:]"), (4, "    logits = logits.masked_fill(logits < cut, -1e9)")]
    assert filter_line(lines) == (4, "logits = logits.masked_fill(logits < cut, -1e9)")
    assert filter_line(lines[:3]) == (1, "v, _ = torch.topk(logits, k)")
    assert filter_line([(5, "    probs = logits.softmax(-1)")]) == (None, None)


def test_the_mass_line_is_the_first_comparison_of_a_cumulative_sum_with_p():
    lines = [(1, "    if top_p < 1.0:"), (2, "    cum = probs.cumsum(-1)"), (3, "    # drop = cum > top_p"),
             (4, "    drop = top_p < cum - probs")]
    assert mass_line(lines) == (4, "drop = top_p < cum - probs")
    assert mass_line(lines[:3]) == (None, None)
    assert mass_line([(1, "    pos = mask.cumsum(-1) - 1"), *lines[:1]]) == (None, None)  # positions, not mass
