"""A model's scalar conventions read from its settings (runners/gpt.py, core/score_scale.py):
mup.py (μP in MiniCPM's way: embeddings times scale_emb, each branch times scale_depth /
sqrt(n_layers) set once in the layer's constructor, the head handed the final hidden states divided
by d_model / base_width, and float32 rotary frequencies whose rounding that factor grows) and
head_multiplier.py (a nanoGPT whose head is handed the final norm's output times output_mult) pass,
the convention naming each factor."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_model_scalars"
KINDS = {"mup.py": ["block", "gpt"], "head_multiplier.py": ["gpt"]}


@pytest.fixture(scope="module")
def results():
    out = {}
    for name, kinds in KINDS.items():
        result = check_file(str(HERE / name), only=kinds)
        out[name] = ({c.kind: c.status for c in result.components}, format_report(result))
    return out


@pytest.mark.parametrize("name, said", [
    ("mup.py", "token embeddings times 10 (read from your settings); logits times 16"),
    ("head_multiplier.py", "token embeddings times 3 (read from your settings); logits times 0.125")])
def test_the_models_factors_are_read_and_compared(results, name, said):
    status, report = results[name]
    assert status == dict.fromkeys(KINDS[name], "pass"), report
    assert said in report, report


def test_a_depth_scale_set_once_in_the_constructor_is_the_residual_multiplier(results):
    assert "each sublayer's output times 0.989949 before the add" in results["mup.py"][1]
