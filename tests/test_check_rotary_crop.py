"""A rotary model whose angle table is computed to its config's block size raises past it, while its
generate method crops to that block (fixtures/learners_rotary_crop/): check's own-model tokens never
reach the block, so the stand-in drives the loop; the crop to the last block passes, to the first block
FAILs as generate_no_crop at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_rotary_crop"


@pytest.mark.parametrize("name, status, lines", [("rotary_lm.py", "pass", set()),
                                                 ("rotary_lm_p_first_block.py", "fail", {72})])
def test_a_crop_past_check_tokens_is_driven_by_the_stand_in(name, status, lines):
    report = check_file(str(HERE / name), only=["gpt", "generate"])
    loop = next(c for c in report.components if c.kind == "generate")
    assert loop.status == status and {f.line for f in loop.findings} == lines, format_report(report)
    assert all(f.name == "generate_no_crop" for f in loop.findings), format_report(report)
