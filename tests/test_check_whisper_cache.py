"""An encoder-decoder's decoder with a KV cache in the manner of openai/whisper's TextDecoder
(tests/fixtures/learners_whisper_cache/correct.py): `Decoder.forward(tokens, audio_features,
cache=None)`, the cache a dict the attention fills in place. It is found by what it builds and takes,
whatever its name; its logits fed one token at a time through the cache must be those of the whole
sequence, and where the positions or the mask rows are not offset by the cached length it FAILs at
that line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CORRECT = Path(__file__).parent / "fixtures" / "learners_whisper_cache" / "correct.py"
PLANTS = {  # name -> (the line as written, the line planted)
    "positions_from_zero": ("x = self.embed(tokens) + self.pos[start:start + T]", "x = self.embed(tokens) + self.pos[:T]"),
    "mask_rows_from_zero": ("mask = self.causal[start:start + T, :start + T]", "mask = self.causal[:T, :start + T]"),
}


@pytest.fixture(scope="module")
def correct():
    return check_file(str(CORRECT))


@pytest.fixture(scope="module", params=sorted(PLANTS))
def planted(request, tmp_path_factory):
    written, plant = PLANTS[request.param]
    path = tmp_path_factory.mktemp("whisper_cache") / f"{request.param}.py"
    assert written in CORRECT.read_text()
    path.write_text(CORRECT.read_text().replace(written, plant))
    return plant, check_file(str(path))


def test_the_decoder_is_found_by_what_it_takes_and_its_cache_passes(correct):
    by_name = {c.name: c for c in correct.components}
    decoder = by_name["Decoder"]
    assert decoder.kind == "cached_decoder" and decoder.status == "pass", format_report(correct)
    assert [c.ok for c in decoder.checks] == [True]
    assert {c.status for c in correct.components} == {"pass"}, format_report(correct)


def test_a_cached_path_not_offset_fails_at_its_line(planted):
    plant, result = planted
    decoder = next(c for c in result.components if c.name == "Decoder")
    assert decoder.status == "fail", format_report(result)
    assert any(f.code == plant for f in decoder.findings), format_report(result)
