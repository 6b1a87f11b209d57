"""Correct code that check's guesses used to fail (tests/fixtures/learners_*): an attention handed its
score bias by its caller (a learned relative-position table kept in the model, scaled or T5's
unscaled scores), a byte-level BPE encoder over an alphabet of its own built from merges alone, a
Unigram tokenizer (no merges), a config whose `hidden` is the model's width, and a padding mask built
from lengths (a list of ints, not check's ids). Each passes or is NOT CHECKED with its reason, never
FAIL; a plant in the attention and in the encoder still fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_results import FIXTURES, checked, component, named, planted_copy, statuses

from handformer.check.core.report import format_report

REL_BIAS = FIXTURES / "learners_rel_bias" / "correct.py"
ALPHABET = FIXTURES / "learners_alphabet_bpe" / "correct.py"
HIDDEN = FIXTURES / "learners_hidden_config" / "correct.py"
SOFTMAX = "att = att.softmax(dim=-1)"
DECODE = ('        chars = "".join(self.id_to_token[i] for i in ids)\n'
          '        return bytes(self.to_byte[c] for c in chars).decode("utf-8", errors="replace")')
PER_TOKEN = ('        return "".join(bytes(self.to_byte[c] for c in self.id_to_token[i]).decode("utf-8", '
             'errors="replace") for i in ids)')


@pytest.fixture(scope="module")
def plants(tmp_path_factory):
    folder: Path = tmp_path_factory.mktemp("guessed")
    return {"rel_bias": planted_copy(REL_BIAS, folder, "rel_bias", (SOFTMAX, "att = att.softmax(dim=-2)")),
            "alphabet": planted_copy(ALPHABET, folder, "alphabet", (DECODE, PER_TOKEN)),
            # d_hidden is the FFN's width to check: the layers are built 40 wide and fed 16
            "width": planted_copy(HIDDEN, folder, "width", ("hidden", "d_hidden"))}


def test_an_attention_handed_its_score_bias_passes_scaled_or_unscaled():
    result = checked("learners_rel_bias")
    assert set(statuses(result).values()) <= {"pass", "differs"}, format_report(result)
    assert "not divided by sqrt(d_k)" in " ".join(
        n["en"] for n in component(result, "UnscaledBiasAttention").notes)


def test_a_plant_in_the_biased_attention_fails_at_its_line(plants):
    result = plants["rel_bias"]
    assert component(result, "BiasedSelfAttention").status == "fail", format_report(result)
    assert ("softmax_wrong_dim", "att = att.softmax(dim=-2)") in named(result, "BiasedSelfAttention")


def test_a_byte_level_encoder_over_its_own_alphabet_passes_with_its_own_ids():
    result = checked("learners_alphabet_bpe")
    assert statuses(result) == {"ByteEncoder": "pass"}, format_report(result)


def test_its_decode_token_by_token_fails_at_its_line(plants):
    result = plants["alphabet"]
    assert component(result, "ByteEncoder").status == "fail", format_report(result)
    assert ("bpe_decode_per_token", PER_TOKEN.strip()) in named(result, "ByteEncoder")


def test_a_unigram_tokenizer_is_graded_by_its_own_scores_not_as_bpe():
    result = checked("learners_unigram_sp")
    comp = component(result, "SentencePieceUnigram")
    assert comp.status == "pass", format_report(result)
    assert any(c.name["en"].startswith("by its own scores") for c in comp.checks), format_report(result)


def test_a_config_whose_hidden_is_the_width_passes():
    result = checked("learners_hidden_config")
    assert set(statuses(result).values()) == {"pass"}, format_report(result)


def test_layers_built_at_a_width_check_misread_are_not_checked(plants):
    result = plants["width"]
    assert set(statuses(result).values()) == {"not_checked"}, format_report(result)
    assert all("takes width 40" in c.error.message for c in result.components)


def test_a_mask_from_lengths_is_not_failed_on_check_s_ids():
    result = checked("learners_len_mask")
    comp = component(result, "make_padding_mask")
    assert comp.status in ("not_checked", "pass"), format_report(result)  # handed lengths, it passes
    assert comp.status == "pass" or "refused the form of check's input" in comp.error.message
