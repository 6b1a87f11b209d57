"""A FAIL that names nothing and quotes no line gets one finding with the learner's line.

Every FAIL says where: a catalogued mistake at its line, the first line where the computation departs
(localize.py), or the line their code raised at (the error's traceback). Where a component failed a
check and neither a mistake nor a departure was found (no localizer for its kind, or one that could not
run), the finding UNLOCATED says so: the failed check, at the line where the component is defined (the
`def` or `class` line of the function, class or method check drove), so that the report still points
into the learner's file and says that no narrower line was singled out.
"""

from __future__ import annotations

from typing import Any

from handformer.check.core.result import FAIL, UNLOCATED, Check, ComponentResult, Finding, text
from handformer.check.core.source import HEADER, source_lines


def place_unlocated(obj: Any, result: ComponentResult) -> None:
    """A FAIL with no finding and no line it raised at: the first failed check, at `obj`'s header."""
    raised = result.error is not None and bool(result.error.traceback)
    if result.status != FAIL or result.findings or raised:
        return
    failed = next((c for c in result.checks if not c.ok), UNSAID)
    said, detail = failed.name, failed.detail or text("", "")
    number, code = header(obj)
    result.findings.append(Finding(UNLOCATED, text(
        f"failed: {said['en']}" + f" ({detail['en']})" * bool(detail["en"]),
        f"未通过：{said['zh']}" + f"（{detail['zh']}）" * bool(detail["zh"])), number, code))


# the failed check the finding names where none of the result's checks failed
UNSAID = Check(text("its values differ from the reference's", "它的数值与参考不同"), False)


def header(obj: Any) -> tuple[int | None, str | None]:
    """The `def` or `class` line of obj (a decorator's line skipped), or (None, None) where it has no
    source check can read (source_lines gives none for it)."""
    return next(((n, line.strip()) for n, line in source_lines([obj]) if HEADER.match(line)), (None, None))
