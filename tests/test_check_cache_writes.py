"""A preallocated KV cache written and read by one helper (fixtures/learners_preallocated_cache/):
`update` writes the call's keys into its buffers and returns the buffers read up to the call's end.
Correct, the loop passes; the new keys written from slot 0 (`self.k[layer, :, :, :T] = k`) FAIL at the
writing line, not at the `return` that reads the buffer back."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import planted_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_preallocated_cache"
FROM_SLOT_0 = ("self.k[layer, :, :, start_pos:start_pos + T], self.v[layer, :, :, start_pos:start_pos + T] = k, v",
               "self.k[layer, :, :, :T], self.v[layer, :, :, :T] = k, v")


def _generate(path: str) -> tuple[str, list[tuple[str, int | None, str]], str]:
    result = check_file(path, only=["generate"])
    component = next(c for c in result.components if c.kind == "generate")
    return component.status, [(f.name, f.line, f.code) for f in component.findings], format_report(result)


def test_the_correct_preallocated_cache_passes():
    status, _, report = _generate(str(HERE / "correct.py"))
    assert status == "pass", report


def test_a_write_from_slot_zero_is_quoted_at_the_writing_line(tmp_path):
    status, findings, report = _generate(planted_copy(tmp_path, "write_offset", HERE / "correct.py", FROM_SLOT_0))
    assert status == "fail", report
    assert findings[0][1:] == (38, "self.k[layer, :, :, :T], self.v[layer, :, :, :T] = k, v"), report
    assert "what line 39 returns" in report
