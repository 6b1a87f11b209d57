"""An encoder-decoder's decoder over a given encoder output, without a KV cache, in two forms
(tests/fixtures/learners_whisper_text/): Whisper's TextDecoder(x, xa) with its own blocks, and a
captioning decoder on torch's TransformerDecoderLayer(tokens, memory). Each is found by what it builds
and takes, checked on what needs no reference (shape, determinism, causality, the encoder's output
read, batch invariance), and its greedy loop (decoder, encoder output, start, end, max length) is driven
through it. A decoder whose blocks get no mask FAILs its causality; a loop that reads the first position
or stops on the wrong token FAILs."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_whisper_text"
FAILING = {"no_mask": "memory_decoder", "first_position": "memory_greedy", "torch_layers_wrong_stop": "memory_greedy"}


@pytest.fixture(scope="module")
def checked():
    return {name: check_file(str(HERE / f"{name}.py")) for name in ("correct", "torch_layers", *FAILING)}


def of_kind(result, kind):
    return next(c for c in result.components if c.kind == kind)


@pytest.mark.parametrize("name", ["correct", "torch_layers"])
def test_the_decoder_and_its_greedy_loop_pass(checked, name):
    result = checked[name]
    decoder, loop = of_kind(result, "memory_decoder"), of_kind(result, "memory_greedy")
    assert decoder.status == "pass" and len(decoder.checks) == 5, format_report(result)
    assert loop.status == "pass", format_report(result)
    assert {c.status for c in result.components} == {"pass"}, format_report(result)


@pytest.mark.parametrize("name", sorted(FAILING))
def test_a_planted_decoder_or_loop_fails(checked, name):
    result = checked[name]
    assert of_kind(result, FAILING[name]).status == "fail", format_report(result)
    others = [c for c in result.components if c.kind != FAILING[name]]
    assert all(c.status == "pass" for c in others if c.kind in ("memory_decoder", "memory_greedy")), (
        format_report(result))
