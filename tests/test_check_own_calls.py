"""Arguments taken from the learner's own calls (handformer/check/core/own_calls.py), on files written
here in three forms (tests/fixtures/learners_own_calls/): a block and its attention told their layer
index, `Block(config, block_idx)` built by the model's comprehension and the index handed on to the
attention's constructor (block_index.py); a forward told its layer number, `block(h, layer_no=n)` in
the model's loop and handed on by position to the attention's forward (layer_number.py); a sinusoidal
table whose width is named `demb`, built as `PositionalEmbedding(self.d_model)` (positions_width.py).
Each correct file passes with the value taken noted (its line); each planted one FAILs, named. A table
that takes 1-D positions (positions_one_d.py), driven by check with hidden states once its width is
taken, raises on check's input: NOT CHECKED, never FAIL."""

from __future__ import annotations

import pytest
from check_results import checked, named, notes, statuses

from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FOLDER = "learners_own_calls"


@pytest.fixture(scope="module")
def block_index():
    return checked(FOLDER, "block_index", only=["causal_attention", "block"])


@pytest.fixture(scope="module")
def layer_number():
    return checked(FOLDER, "layer_number", only=["causal_attention", "block"])


def test_a_layer_index_from_the_models_comprehension_is_taken(block_index):
    assert statuses(block_index) == {"CausalSelfAttention": "pass", "Block": "pass"}, format_report(block_index)
    said = "block_idx = 0 taken from the file's own call at line {} (a loop's index: layer 0)"
    assert said.format(71) in notes(block_index, "Block")
    assert said.format(56) in notes(block_index, "CausalSelfAttention")  # handed on by Block's constructor


def test_the_note_is_said_in_chinese(block_index):
    zh = " ".join(n["zh"] for c in block_index.components for n in c.notes)
    assert "block_idx = 0 取自文件自己在第 71 行的调用（循环的下标：取层 0）" in zh


def test_a_layer_number_passed_to_forward_by_keyword_and_handed_on_is_taken(layer_number):
    assert statuses(layer_number) == {"SelfAttention": "pass", "DecoderBlock": "pass"}, format_report(layer_number)
    said = "layer_no = 0 taken from the file's own call at line {} (a loop's index: layer 0)"
    assert said.format(69) in notes(layer_number, "DecoderBlock")
    assert said.format(53) in notes(layer_number, "SelfAttention")


def test_a_width_under_a_name_of_its_own_is_the_callers_size():
    result = checked(FOLDER, "positions_width", only=["positional_encoding"])
    assert statuses(result) == {"PositionalEmbedding": "pass"}, format_report(result)
    assert "demb = 16 taken from the file's own call at line 71" in notes(result, "PositionalEmbedding")


@pytest.mark.parametrize(("name", "component", "mistake"), [
    ("block_index_planted", "CausalSelfAttention", "scale_by_dk"),
    ("layer_number_planted", "SelfAttention", "no_scaling"),
    ("positions_width_planted", "PositionalEmbedding", "pe_wrong_frequency"),
])
def test_a_plant_in_a_component_built_from_the_files_calls_fails_named(name, component, mistake):
    result = checked(FOLDER, name, only=["causal_attention", "positional_encoding"])
    assert statuses(result)[component] == "fail", format_report(result)
    assert mistake in [n for n, _ in named(result, component)]


def test_a_component_driven_only_with_taken_arguments_that_raises_on_checks_inputs_is_not_failed():
    result = checked(FOLDER, "positions_one_d", only=["positional_encoding"])
    assert statuses(result) == {"PositionalEmbedding": "not_checked"}, format_report(result)
    error = result.components[0].error
    assert "only with arguments taken from your file's own calls (demb = 16 (line 26))" in error.message
    assert "只能用取自你文件自己调用的参数（demb = 16（第 26 行））" in error.message_zh
