"""A SentencePiece-style BPE (fixtures/learners_sentencepiece/): train(text) takes one string (it is
handed the fixture's lines joined by spaces, which ▁ cuts into the same words), unseen characters fall
back to byte pieces; correct, it passes; decoding each byte piece on its own, merging the pair learnt
last first and keeping the space the ▁ in front of the text decodes to are each reported at their
line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_sentencepiece"
PLANTS = {"decode_per_byte.py": ("bpe_decode_per_token", 83), "latest_merge_first.py": ("bpe_encode_merge_order", 65),
          "space_kept.py": ("departs", 87)}


@pytest.fixture(scope="module", params=["correct.py", *PLANTS])
def checked(request):
    return request.param, check_file(str(HERE / request.param), only=["bpe_tokenizer"])


def test_correct_passes_and_each_plant_is_named_at_its_line(checked):
    name, result = checked
    (tok,) = result.components
    if name == "correct.py":
        assert tok.status == "pass" and len(tok.checks) == 3, format_report(result)
    else:
        assert tok.status == "fail" and PLANTS[name] in [(f.name, f.line) for f in tok.findings], \
            format_report(result)
