"""Styles check drives by what the code does, each with a plant that fails and its correct twin: masks
that say True = masked read so per component (a standalone attention as its file's layers), graykode's
get_attn_pad_mask(seq_q, seq_k), and a language model's step with gradient accumulation driven with
more than one micro-batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

LAYOUTS = Path(__file__).parent / "fixtures" / "learners_layouts" / "correct.py"


def _planted(tmp_path: Path, edits: list[tuple[str, str]], source: Path = LAYOUTS) -> str:
    text = source.read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text, f"{old!r} is not in {source.name}"
        text = text.replace(old, new, 1)
    path = tmp_path / source.name
    path.write_text(text, encoding="utf-8")
    return str(path)


SCALE_BY_DK = [("/ math.sqrt(Q.size(-1))", "/ Q.size(-1)")]


@pytest.mark.parametrize("planted", [False, True])
def test_an_attention_whose_mask_says_true_is_masked_is_read_so(tmp_path, planted):
    """masked_fill(attn_mask, -1e9) in the attention (or in the class it holds): torch.nn's convention
    is tried first, so the correct twin passes and a plant is named for its own mistake alone."""
    result = check_file(_planted(tmp_path, SCALE_BY_DK * planted), only=["mask_helper", "sdpa", "mha"])
    helper, sdpa, mha = result.components
    assert helper.status == "pass", format_report(result)
    for comp in (sdpa, mha):
        assert "True = masked" in comp.convention["en"], format_report(result)
        assert [f.name for f in comp.findings] == (["scale_by_dk"] if planted else []), format_report(result)
        assert comp.status == ("fail" if planted else "pass"), format_report(result)


@pytest.mark.parametrize("planted", [False, True])
def test_a_step_with_gradient_accumulation_is_driven_with_two_micro_batches(tmp_path, planted):
    edits = [("(loss / grad_accum_steps).backward()", "loss.backward()")] * planted
    result = check_file(_planted(tmp_path, edits), only=["lm_train_step"])
    (step,) = result.components
    assert any("grad_accum_steps=2" in n["en"] for n in step.notes), format_report(result)
    assert [f.name for f in step.findings] == (["train_step_loss_not_divided"] if planted else [])
    assert step.status == ("fail" if planted else "pass"), format_report(result)
