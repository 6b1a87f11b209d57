"""An OPT-style model (fixtures/learners_opt_offset/): learned positions read at row p + 2 of a table
of max_position_embeddings + 2 rows. Its generate passes whether it crops the context to
max_position_embeddings or stops once the context is full (Hugging Face's generate stops at
max_length: a convention, noted); a crop to the table's rows (2 too many) fails as generate_no_crop,
and a loop that stops one token early fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_opt_offset"
FILES = {"correct": "pass", "correct_stops_when_full": "pass", "crop_to_table_rows": "fail",
         "stops_one_early": "fail"}


@pytest.fixture(scope="module", params=list(FILES))
def checked(request):
    return request.param, check_file(str(HERE / f"{request.param}.py"), only=["generate"])


def test_each_generate_passes_or_fails_as_written(checked):
    name, result = checked
    loop = next(c for c in result.components if c.name == "generate")
    assert loop.status == FILES[name], format_report(result)
    stops = any("stops once the context holds" in n["en"] for n in loop.notes)
    assert stops == (name == "correct_stops_when_full"), format_report(result)
    if name == "crop_to_table_rows":
        assert [f.name for f in loop.findings] == ["generate_no_crop"], format_report(result)
