"""T5 v1.1 as a learner writes it (tests/fixtures/learners_t5v11/): relative position buckets in the
first layer's self-attention shared by the others, unscaled scores, a gated-GELU FFN, RMSNorm, an
encoder-decoder with cross-attention and a greedy decode that names Hugging Face's
`decoder_start_token_id`. Its masks are filled with `torch.finfo(x.dtype).min` of check's float64 x
on a float32 `torch.zeros(shape)`, which runs; the model has no reference to compare with (no
Seq2SeqTransformer adds T5's bias) and passes on the checks that need none; the decode is driven
through the file's own model. The planted files FAIL."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_t5v11"


@pytest.fixture(scope="module")
def checked():
    return {name: check_file(str(HERE / f"{name}.py")) for name in ("correct", "first_position", "no_future_mask")}


def by_name(result):
    return {c.name: c for c in result.components}


def test_the_correct_model_and_decode_pass_on_their_checks(checked):
    result = checked["correct"]
    found = by_name(result)
    model, decode = found["T5Model"], found["greedy_decode"]
    assert model.status == "pass" and len(model.checks) >= 5, format_report(result)
    assert any("relative-position bias" in str(n) for n in model.notes), format_report(result)
    assert decode.kind == "greedy_decode" and decode.status == "pass", format_report(result)
    assert "fail" not in {c.status for c in result.components}, format_report(result)


def test_a_decode_that_reads_the_first_position_fails(checked):
    result = checked["first_position"]
    assert by_name(result)["greedy_decode"].status == "fail", format_report(result)
    assert by_name(result)["T5Model"].status == "pass", format_report(result)


def test_a_decoder_that_sees_the_future_fails_its_causality(checked):
    result = checked["no_future_mask"]
    model = by_name(result)["T5Model"]
    assert model.status == "fail", format_report(result)
    assert any("causality" in str(c.name) and not c.ok for c in model.checks), format_report(result)
