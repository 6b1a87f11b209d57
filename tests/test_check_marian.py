"""Marian's layout (fixtures/learners_marian/): post-norm layers whose FFN is fc1 -> swish -> fc2 pass
(a plain SiLU FFN is read as such); a model called Hugging Face's way, forward(input_ids,
attention_mask, decoder_input_ids), with the sines in the first half of its table, passes; with the
halves swapped it fails; one vocabulary for both languages is NOT CHECKED with its reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_marian"


@pytest.fixture(scope="module")
def shared():
    return check_file(str(HERE / "shared_vocab.py"), only=["encoder_layer", "decoder_layer", "transformer"])


@pytest.fixture(scope="module")
def two_vocabs():
    return check_file(str(HERE / "two_vocabs.py"), only=["transformer"])


@pytest.fixture(scope="module")
def pe_swapped():
    return check_file(str(HERE / "pe_swapped.py"), only=["transformer"])


@pytest.fixture(scope="module")
def relu_ffn():
    return check_file(str(HERE / "relu_ffn.py"), only=["encoder_layer"])


def test_the_swish_layers_and_the_model_of_one_vocabulary_pass(shared):
    status = {c.name: c.status for c in shared.components}
    assert status == {"EncoderLayer": "pass", "DecoderLayer": "pass", "Transformer": "pass"}, \
        format_report(shared)


def test_the_model_called_by_name_with_half_split_positions_passes(two_vocabs):
    (model,) = two_vocabs.components
    assert model.status == "pass", format_report(two_vocabs)


def test_the_halves_swapped_fail(pe_swapped):
    (model,) = pe_swapped.components
    assert model.status == "fail", format_report(pe_swapped)


def test_an_activation_other_than_swish_fails_at_its_line(relu_ffn):
    (layer,) = relu_ffn.components
    assert layer.status == "fail" and 52 in [f.line for f in layer.findings], format_report(relu_ffn)
