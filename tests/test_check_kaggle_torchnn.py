"""Models built on torch's own layers, in the Kaggle notebooks' styles (tests/fixtures/
learners_kaggle_torchnn/): a decoder layer on nn.MultiheadAttention with its own residual pieces and
torch.nn's masks (tgt_key_padding_mask beside memory_key_padding_mask), a GPT whose blocks take the
float32 -inf mask of nn.Transformer.generate_square_subsequent_mask, and a decoder layer wrapping
nn.TransformerDecoderLayer (norm_first) with a greedy loop whose max_len counts the new tokens. Each
correct file passes whole (one check run each); a plant in each still fails, at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

FOLDER = Path(__file__).parent / "fixtures" / "learners_kaggle_torchnn"


@pytest.fixture(scope="module")
def results():
    return {name: check_file(str(FOLDER / f"{name}.py")) for name in ("translation", "gpt_mha", "decoder_wrapper")}


def by_name(result):
    return {c.name: c for c in result.components}


@pytest.mark.parametrize("name", ["translation", "gpt_mha", "decoder_wrapper"])
def test_the_correct_file_passes_whole(results, name):
    result = results[name]
    assert exit_code(result) == 0, format_report(result)
    assert {c.status for c in result.components} <= {"pass", "differs"}, format_report(result)


def test_the_targets_key_padding_mask_is_the_targets(results):
    layer = by_name(results["translation"])["DecoderLayer"]
    assert layer.status == "pass", format_report(results["translation"])
    assert any("tgt_key_padding_mask alone" in c.name["en"] and c.ok for c in layer.checks)


def test_a_float32_minus_inf_mask_in_a_float64_check_is_no_mistake(results):
    comps = by_name(results["gpt_mha"])
    assert comps["GPTLanguageModel"].status == "pass" and comps["GPTLanguageModel"].max_abs_error < 1e-9
    assert comps["Block"].status == "pass"  # the tutorial-size attn_mask has the tutorial's 8 heads


def test_a_greedy_loop_whose_max_len_counts_new_tokens(results):
    comps = by_name(results["decoder_wrapper"])
    assert comps["DecoderLayer"].status == "differs"  # norm_first: pre-norm, by design
    decode = comps["greedy_decode"]
    assert decode.status == "pass" and any("counts the new tokens" in n["en"] for n in decode.notes)


PLANTS = [
    ("gpt_mha", "mask = nn.Transformer.generate_square_subsequent_mask(T, device=idx.device)",
     'mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=2)', "GPTLanguageModel", "causal_off_by_one"),
    ("decoder_wrapper", "        if (ys == EOS_IDX).any(1).all():\n            break\n", "", "greedy_decode",
     "greedy_no_stop_at_eos"),
]


@pytest.mark.parametrize("name, old, new, component, finding", PLANTS, ids=[p[-1] for p in PLANTS])
def test_a_plant_still_fails_at_its_line(tmp_path, name, old, new, component, finding):
    result = check_file(edited_copy(tmp_path, FOLDER / f"{name}.py", [(old, new)]))
    comp = by_name(result)[component]
    assert comp.status == "fail", format_report(result)
    (found,) = [f for f in comp.findings if f.name == finding]
    assert found.code and (new.strip() in found.code or new == ""), found
    assert not [c for c in result.components if c.status == "fail" and c.name.endswith(".generate")]
