"""`handformer check` on decoder-only models whose FFN is not 4 * d_model wide: blocks on torch's
nn.TransformerEncoderLayer(dim_feedforward=2 * d_model), and hand-written blocks whose FFN is 3 *
d_model wide (the rows of a fused q|k|v projection) beside separate projections or a fused c_attn. A
(F, D) linear beside its (D, F) down projection (before it, or right after it in Meta's w1, w2, w3) is the
FFN's; one that the attention's (D, D)
output follows is the fused q|k|v: the block and the model are mapped and pass, and planted mistakes
fail at their line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_torch_widths"
CORRECT = ("correct", "three_wide", "fused_wide", "swiglu_meta_order")
PLANTED = {"final_norm_unused": ("final_norm_missing", 32), "three_wide_unscaled": ("no_scaling", 26),
           "fused_wide_no_residual": ("no_residual", 31)}


@pytest.fixture(scope="module")
def reports():
    return {name: check_file(str(HERE / f"{name}.py")) for name in (*CORRECT, *PLANTED)}


@pytest.mark.parametrize("name", CORRECT)
def test_the_block_and_the_model_are_mapped_and_pass(reports, name):
    status = {c.name: c.status for c in reports[name].components}
    assert status == {"Block": "pass", "GPT": "pass"}, format_report(reports[name])


@pytest.mark.parametrize("name", PLANTED)
def test_a_planted_mistake_is_named_at_its_line(reports, name):
    failed = [c for c in reports[name].components if c.status == "fail"]
    assert failed, format_report(reports[name])
    for component in failed:
        assert [(f.name, f.line) for f in component.findings] == [PLANTED[name]], format_report(reports[name])
