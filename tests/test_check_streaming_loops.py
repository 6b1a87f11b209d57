"""Two decoding loops of newer forms, each correct and planted:
- a StreamingLLM generate (fixtures/learners_attention_sinks/): attention sinks and a window of recent
  tokens in a Hugging Face-style cache, keys re-rotated when the window slides. Its window is widened so
  that its cache drops nothing in check's runs (noted): it passes; the whole prefix fed again with the
  cache, and the cache not passed back, fail at their lines.
- batched greedy generation with left padding (fixtures/learners_left_pad_batch/): positions from the
  cumulative sum of the mask, each row stopped at its own EOS and padded after it. It passes, also
  when it never breaks early (a finished row padded to max_new_tokens: padding, not tokens after EOS);
  positions that ignore the padding, and finished rows not padded, fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.runners.generate_loop import WIDE

FIXTURES = Path(__file__).parent / "fixtures"
# the file -> (its status, the lines its findings quote)
FILES = {"learners_attention_sinks/correct": ("pass", []),
         "learners_attention_sinks/prefix_refed": ("fail", [118]),
         "learners_attention_sinks/cache_not_passed": ("fail", [118]),
         "learners_left_pad_batch/correct": ("pass", []),
         "learners_left_pad_batch/correct_no_break": ("pass", []),
         "learners_left_pad_batch/positions_ignore_padding": ("fail", [71]),  # unlocated: the loop's def line
         "learners_left_pad_batch/finished_rows_not_padded": ("fail", [71])}


@pytest.fixture(scope="module", params=list(FILES))
def checked(request):
    return request.param, check_file(str(FIXTURES / f"{request.param}.py"), only=["generate"])


def test_each_loop_passes_or_fails_as_written(checked):
    name, result = checked
    loop = next(c for c in result.components if c.name == "generate")
    status, lines = FILES[name]
    assert loop.status == status and [f.line for f in loop.findings] == lines, format_report(result)


def test_a_streaming_cache_is_run_with_a_window_that_drops_nothing(checked):
    name, result = checked
    loop = next(c for c in result.components if c.name == "generate")
    widened = [n["en"] for n in loop.notes if "attention sinks" in n["en"]]
    assert widened == ([f"its cache keeps attention sinks and a window of recent tokens: run with window={WIDE}, "
                        "so that it drops nothing and its tokens are full-context decoding's; what it drops past "
                        "the window is not compared"] if "sinks" in name else []), format_report(result)
