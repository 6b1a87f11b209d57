"""GPT-2's encoder.py layout (fixtures/learners_gpt2_encoder/): a class with bpe(), encode() and
decode(), built as Encoder(encoder, bpe_merges) from strings of GPT-2's printable byte characters, is
found by its methods and handed the reference's vocabulary and merges in that form; correct, it
passes; each planted mistake fails named at its line (the trainer's whole text as one pre-token
too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_gpt2_encoder"
PLANTS = {  # file -> (the kind checked, the finding, its line)
    "encode_merge_order.py": ("bpe_tokenizer", "bpe_encode_merge_order", 41),
    "decode_per_token.py": ("bpe_tokenizer", "bpe_decode_per_token", 63),
    "merges_across_pretokens.py": ("bpe", "bpe_merges_across_pretokens", 71),
}


def test_the_encoder_class_is_checked_and_passes():
    result = check_file(str(HERE / "correct.py"), only=["bpe_tokenizer"])
    assert {c.name: c.status for c in result.components} == {"Encoder": "pass"}, format_report(result)


@pytest.mark.parametrize("name", list(PLANTS))
def test_each_plant_is_named_at_its_line(name):
    kind, finding, line = PLANTS[name]
    result = check_file(str(HERE / name), only=[kind])
    found = [(f.name, f.line) for c in result.components if c.status == "fail" for f in c.findings]
    assert (finding, line) in found, format_report(result)
