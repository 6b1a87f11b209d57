"""`handformer check` on GPT-2 written in the layout of Hugging Face's modeling_gpt2.py: a plain config
class (not a dataclass) whose constructor sets the fields the modules read, Conv1D layers (a Linear
with its weight stored (in, out)), and a head that returns (loss, logits) with the labels shifted
inside. The config class is built for the block and the model (their `config` is unannotated), and the
loss is the number the forward returns, wherever it stands in the tuple."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_gpt2_hf"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


def test_every_gpt2_component_is_built_from_the_config_class_and_passes(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"GPT2Attention": "pass", "GPT2MLP": "pass", "GPT2Block": "pass",
                      "GPT2LMHeadModel": "pass"}, format_report(correct)


def test_the_model_loss_is_read_first_in_its_tuple(correct):
    model = correct.components[-1]
    assert any(c.ok and "loss equals" in c.name["en"] for c in model.checks), format_report(correct)
    assert "c_attn.T[0:16] -> W_Q" in str(correct.components[0].mapping)


def test_a_score_scaled_by_the_width_fails_at_its_line():
    result = check_file(str(HERE / "scale_by_width.py"), only=["mha", "gpt"])
    report = format_report(result)
    assert [c.status for c in result.components] == ["fail", "fail"], report
    (finding,) = result.components[0].named()
    assert finding.name == "scale_by_dk" and "math.sqrt(C)" in finding.code, report
