"""Models that build what check hands other models, and the loops driven on them (files written here in
a RoBERTa fine-tuning style and a fairseq-like translation style, none copied): a classifier holding an
encoder model and a head module is checked from its outputs, and a step that reads its batch by key is
driven on that classifier; a translation model given its pad id builds its own masks from it (checked
again with pad id 3), its vocabularies named encoder_vocab / decoder_vocab (or one joined dictionary,
compared with the target's vocabulary on both sides), and an epoch that sets its rate from embed_dim is
driven with the stand-in's width. Each correct file passes every component; a
planted mistake fails quoting its line."""

from __future__ import annotations

import pytest
from check_results import checked, component, statuses

from handformer.check.core.discovery import size_of

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def roberta():
    return {name: checked("learners_roberta_head", name) for name in ("correct", "p_no_zero_grad",
                                                                      "p_mask_dropped")}


@pytest.fixture(scope="module")
def fairseq():
    return {name: checked("learners_fairseq_masks", name) for name in ("correct", "p_pad_zero", "shared")}


def test_roberta_head_correct_passes_every_component(roberta):
    assert set(statuses(roberta["correct"]).values()) == {"pass"}
    assert statuses(roberta["correct"]).keys() >= {"TextClassifier", "RobertaModel", "training_step"}


def test_step_without_zero_grad_quotes_the_commented_line(roberta):
    step = component(roberta["p_no_zero_grad"], "training_step")
    assert step.status == "fail"
    assert [(f.name, f.code) for f in step.findings] == [("train_step_no_zero_grad", "# optimizer.zero_grad()")]


def test_classifier_dropping_the_mask_quotes_the_encoder_call(roberta):
    head = component(roberta["p_mask_dropped"], "TextClassifier")
    assert head.status == "fail"
    assert any("self.roberta(input_ids))" in (f.code or "") for f in head.findings)


def test_fairseq_like_model_epoch_and_greedy_pass(fairseq):
    assert statuses(fairseq["correct"]) == {"TranslationModel": "pass", "greedy_decode": "pass",
                                            "train_one_epoch": "pass"}


def test_one_joined_dictionary_is_compared_and_decoded(fairseq):
    assert statuses(fairseq["shared"]) == {"TranslationModel": "pass", "greedy_decode": "pass"}
    assert "tied to the target embedding" in component(fairseq["shared"], "TranslationModel").convention["en"]


def test_pad_id_written_as_zero_is_named(fairseq):
    model = component(fairseq["p_pad_zero"], "TranslationModel")
    assert model.status == "fail"
    assert [(f.name, f.code) for f in model.findings] == [("mask_pad_id", "pad = src_tokens.eq(0)  # (B, S), True = pad")]


@pytest.mark.parametrize(("name", "size"), [("trg_vocab", "tgt_vocab"), ("decoder_vocab", "tgt_vocab"),
                                            ("encoder_vocab", "src_vocab"), ("target_vocab_len", "tgt_vocab"),
                                            ("dictionary_size", "src_vocab"), ("type_vocab_size", None)])
def test_vocabulary_named_by_its_side(name, size):
    assert size_of(name) == size
