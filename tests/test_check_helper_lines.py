"""A departure inside a free function of the learner's file is quoted at that function's line, however
deep the calls go: tests/fixtures/learners_helper_lines/correct.py (an RMSNorm whose forward calls
`rms_norm`, which calls `mean_square`; a LayerNorm whose method calls `centered`; a gated FFN whose
forward calls `swiglu`, which calls `silu`), each with one line of a helper planted."""

from __future__ import annotations

import pytest
from check_results import FIXTURES, component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

SOURCE = FIXTURES / "learners_helper_lines" / "correct.py"
PLANTS = {  # component -> (the helper's line as written, as planted)
    "RMSNorm": ("return x.float().pow(2).mean(dim=-1, keepdim=True)",
                "return x.float().pow(2).sum(dim=-1, keepdim=True)"),
    "LayerNorm": ("return x - x.mean(dim=-1, keepdim=True)", "return x - x.mean(dim=0, keepdim=True)"),
    "GatedFeedForward": ("return x * torch.sigmoid(x)", "return x * torch.sigmoid(2 * x)"),
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """Every plant in one copy (each in its own component), checked once."""
    text = SOURCE.read_text()
    for written, plant in PLANTS.values():
        assert written in text, f"{SOURCE.name} no longer holds {written!r}"
        text = text.replace(written, plant)
    path = tmp_path_factory.mktemp("helper_lines") / "planted.py"
    path.write_text(text)
    return check_file(str(path))


def _line_of(written: str) -> int:
    return next(i for i, line in enumerate(SOURCE.read_text().splitlines(), 1) if written in line)


@pytest.mark.parametrize("name", PLANTS)
def test_a_plant_in_a_helper_fails_quoting_the_helpers_line(checked, name):
    result = component(checked, name)
    assert result.status == "fail", format_report(checked)
    lines = [f.line for f in result.findings]
    assert lines == [_line_of(PLANTS[name][0])], format_report(checked)
