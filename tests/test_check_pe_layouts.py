"""The sinusoidal positional encoding in the layouts public code uses: a function that makes the
table (the TensorFlow tutorial's positional_encoding, numpy; Whisper's sinusoids), tensor2tensor's
[sin | cos] halves (DIFFERS, a convention), fairseq's encoding of token ids counted after the padding
index; each with a plant that fails."""

from __future__ import annotations

from pathlib import Path

from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_pe" / "correct.py"
PLANTS = [  # one mistake in each encoding
    ("angle_rads[:, 1::2] = np.cos(angle_rads[:, 1::2])", "angle_rads[:, 1::2] = np.cos(angle_rads[:, 0::2])"),
    ("torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)",
     "torch.cat([torch.cos(scaled_time), torch.sin(scaled_time)], dim=1)"),
    ("* mask + self.padding_idx", "* mask + self.padding_idx + 1")]


def test_the_layouts_of_public_code_pass_or_differ_by_design():
    result = check_file(str(CORRECT))
    statuses = {c.name: c.status for c in result.components}
    assert statuses == {"positional_encoding": "pass", "sinusoids": "differs",
                        "SinusoidalPositionalEmbedding": "differs"}, format_report(result)
    by_name = {c.name: c for c in result.components}
    assert "tensor2tensor" in by_name["sinusoids"].convention["en"]
    assert any("start at 1" in n["en"] for n in by_name["SinusoidalPositionalEmbedding"].notes)


def test_a_mistake_in_each_layout_fails(tmp_path):
    result = check_file(edited_copy(tmp_path, CORRECT, PLANTS))
    by_name = {c.name: c for c in result.components}
    assert {c.status for c in result.components} == {"fail"}, format_report(result)
    (swapped,) = by_name["sinusoids"].findings
    assert (swapped.name, swapped.line) == ("pe_sin_cos_swapped", 34), format_report(result)
    assert by_name["positional_encoding"].max_abs_error > 0.5
