"""Training loops and models driven as their files lay them out (tests/fixtures/learners_torchnn_first/,
learners_zh_walkthrough/, and learners_d2l_zh/ without its interfaces): PyTorch's translation tutorial's
train_epoch on sequence-first batches, (S, B), beside a create_mask that reads the module's PAD_IDX = 1
without taking it; a walkthrough GPT's train_step(model, optimizer) drawing from its file's
get_batch('train'); a GRU model beside sampling filters, which is no Transformer to check; d2l's
EncoderDecoder(encoder, decoder) with TransformerEncoder and TransformerDecoder written on nn.Module.
Each correct file passes whole (one check run each); a plant in each still fails, named, at its line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

FIXTURES = Path(__file__).parent / "fixtures"
TRANSLATION = FIXTURES / "learners_torchnn_first" / "translation.py"
POEM_GPT = FIXTURES / "learners_zh_walkthrough" / "poem_gpt.py"
GRU = FIXTURES / "learners_zh_walkthrough" / "gru_sampling.py"


def d2l_on_modules(folder: Path) -> str:
    """learners_d2l_zh/correct.py with its Encoder, Decoder and AttentionDecoder interfaces taken out, its
    stacks written on nn.Module."""
    text = (FIXTURES / "learners_d2l_zh" / "correct.py").read_text(encoding="utf-8")
    text = re.sub(r"class Encoder\(nn\.Module\):[\s\S]*?(?=class EncoderDecoder)", "", text)
    text = text.replace("(Encoder):", "(nn.Module):").replace("(AttentionDecoder):", "(nn.Module):")
    path = folder / "d2l_on_modules.py"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    files = {"translation": str(TRANSLATION), "poem_gpt": str(POEM_GPT), "gru": str(GRU),
             "d2l": d2l_on_modules(tmp_path_factory.mktemp("d2l"))}
    return {name: check_file(path) for name, path in files.items()}


def by_name(result):
    return {c.name: c for c in result.components}


@pytest.mark.parametrize("name", ["translation", "poem_gpt", "gru", "d2l"])
def test_the_correct_file_passes_whole(results, name):
    result = results[name]
    assert exit_code(result) == 0, format_report(result)
    assert {c.status for c in result.components} <= {"pass", "differs"}, format_report(result)


def test_a_sequence_first_epoch_is_driven_sequence_first(results):
    epoch = by_name(results["translation"])["train_epoch"]
    assert any("sequence-first" in n["en"] for n in epoch.notes), epoch.notes
    mask = by_name(results["translation"])["create_mask"]
    assert any("padded with 1 (your module's PAD_IDX)" in n["en"] for n in mask.notes), mask.notes


def test_a_step_drawing_from_its_files_get_batch_is_a_language_model_step(results):
    step = by_name(results["poem_gpt"])["train_step"]
    assert step.kind == "lm_train_step"
    assert any("get_batch draws" in c.name["en"] and c.ok for c in step.checks), step.checks


def test_a_gru_model_is_no_transformer_to_check(results):
    assert "TinyGRULM" not in by_name(results["gru"])


def test_an_encoder_decoder_of_stacks_on_nn_module_is_built(results):
    assert by_name(results["d2l"])["EncoderDecoder"].status == "pass"


# (file, its edits, the component that fails, the finding, the code it quotes); the mask helper's plant
# reads no pad id at all (both masks compare with 0), so only the module's PAD_IDX says it is 1
PLANTS = [
    (TRANSLATION, [("        tgt_out = tgt[1:, :]", "        tgt_out = tgt[:-1, :]")], "train_epoch",
     "train_step_no_shift", "tgt_out = tgt[:-1, :]"),
    (TRANSLATION, [("(src == PAD_IDX)", "(src == 0)"), ("(tgt == PAD_IDX)", "(tgt == 0)")], "create_mask",
     "mask_pad_id", "== 0"),
    (POEM_GPT, [("source[s + 1:s + 1 + block_size]", "source[s:s + block_size]")], "train_step",
     "train_step_no_shift", "targets = torch.stack([source[s:s + block_size] for s in starts])"),
]


@pytest.mark.parametrize("source, edits, component, finding, code", PLANTS, ids=[p[-2] for p in PLANTS])
def test_a_plant_still_fails_at_its_line(tmp_path, source, edits, component, finding, code):
    result = check_file(edited_copy(tmp_path, source, edits))
    comp = by_name(result)[component]
    assert comp.status == "fail", format_report(result)
    (found,) = [f for f in comp.findings if f.name == finding]
    assert found.code and code in found.code, found
