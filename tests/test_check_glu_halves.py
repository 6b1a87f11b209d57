"""A gated FFN's two halves of one projection are a layout, not a mistake (runners/pieces.py: fused_halves).

Where gate and up are the two halves of one fused projection (`a, b = proj(x).chunk(2)` or `.split(F)`),
either half activated is the same function with the projection's rows swapped: ModernBERT's
`input, gate` with the GELU on `input`, Phi-3's `gate, up` with the SiLU on `gate`, and a `split` whose
first half is activated all pass, graded in the file's own order. Separate layers named for their
roles still fail `gated_activation_wrong_branch` when the one named up is activated
(tests/fixtures/learners_glu_halves/halves.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import component

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FILE = Path(__file__).parent / "fixtures" / "learners_glu_halves" / "halves.py"


@pytest.fixture(scope="module")
def result():
    return check_file(str(FILE), only=["ffn"])


@pytest.mark.parametrize("name", ["GeGLUMLP", "SplitMLP", "Phi3MLP"])
def test_either_half_of_one_projection_activated_passes(result, name):
    c = component(result, name)
    assert c.status == "pass" and not c.findings, format_report(result)


def test_separate_layers_with_the_up_one_activated_still_fail(result):
    c = component(result, "SwiGLU")
    assert c.status == "fail", format_report(result)
    assert [(f.name, f.line) for f in c.findings] == [("gated_activation_wrong_branch", 61)]
