"""ALBERT's layout (fixtures/learners_albert/): the attention adds its residual and applies its own
LayerNorm, defined after the layer's own norm; the layer's norms are read in the order of the
sublayers whose modules hold them, so the correct layer passes. The model, found by its name's
ending and its token types, must keep its pooled output free of the padded tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_albert"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"), only=["encoder_layer", "encoder_model"])


@pytest.fixture(scope="module")
def pooler_last():
    return check_file(str(HERE / "pooler_last.py"), only=["encoder_model"])


@pytest.fixture(scope="module")
def ffn_pre_norm():
    return check_file(str(HERE / "ffn_pre_norm.py"), only=["encoder_layer"])


def _line(text: str, result) -> int:
    return next(n for n, line in enumerate(Path(result.path).read_text().splitlines(), 1) if text in line)


def test_the_shared_layer_and_the_model_pass(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"SharedLayer": "pass", "TinyAlbertModel": "pass"}, format_report(correct)
    layer = next(c for c in correct.components if c.name == "SharedLayer")
    assert "attn.norm -> norm 1 (self-attention)" in layer.mapping, layer.mapping


def test_a_pooler_on_the_last_position_fails_at_its_line(pooler_last):
    (model,) = pooler_last.components
    found = [(f.name, f.line) for f in model.findings]
    assert model.status == "fail" and ("departs", _line("x[:, -1]", pooler_last)) in found, format_report(pooler_last)


def test_the_ffn_made_pre_norm_is_named(ffn_pre_norm):
    (layer,) = ffn_pre_norm.components
    found = [(f.name, f.line) for f in layer.findings]
    assert ("pre_norm", _line("self.final_norm(a))))", ffn_pre_norm)) in found, format_report(ffn_pre_norm)
