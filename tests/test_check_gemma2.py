"""`handformer check` on a Gemma 2 written from the Hugging Face port: a decoder layer handed two masks
(a global one and a sliding-window one, each layer picking its own) is driven with the causal mask as
both; its attention's soft cap (attn_logit_softcapping) is read from its setting and the reference
block caps its scores the same way; a cap that forgets to divide fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_gemma2"


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "correct.py"))


def test_every_gemma2_component_is_checked_and_passes(correct):
    status = {c.name: c.status for c in correct.components}
    assert status == {"Gemma2Attention": "pass", "Gemma2MLP": "pass", "RMSNorm": "differs",
                      "Gemma2DecoderLayer": "pass", "Gemma2ForCausalLM": "pass"}, format_report(correct)


def test_the_layer_handed_two_masks_is_compared_with_its_cap(correct):
    layer = next(c for c in correct.components if c.name == "Gemma2DecoderLayer")
    assert any("50 * tanh(scores / 50)" in n["en"] for n in layer.notes), format_report(correct)
    assert layer.max_abs_error < 1e-6


def test_a_cap_that_forgets_to_divide_fails_the_layer_at_its_line():
    result = check_file(str(HERE / "cap_not_divided.py"), only=["gqa", "block"])
    assert [c.status for c in result.components] == ["fail", "fail"], format_report(result)
    layer = result.components[1]
    assert any(f.code == "scores = self.softcap * torch.tanh(scores)" for f in layer.findings), layer.findings


def test_a_normalizer_computed_as_a_power_and_never_applied_is_named(tmp_path):
    """embedding_scale_unused where the model computes its sqrt(d_model) as `hidden_size ** 0.5`."""
    edit = ("        x = self.embed_tokens(input_ids) * math.sqrt(self.config.hidden_size)\n",
            "        normalizer = self.config.hidden_size ** 0.5\n        x = self.embed_tokens(input_ids)\n")
    (model,) = check_file(edited_copy(tmp_path, HERE / "correct.py", [edit]), only=["gpt"]).components
    (finding,) = model.findings
    assert model.status == "fail" and finding.name == "embedding_scale_unused", model.findings
    assert finding.code == "x = self.embed_tokens(input_ids)"
