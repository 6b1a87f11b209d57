"""A mask found by what the code does with it, whatever its name (core/context.py, used_as_mask):
a block handed its mask by its model is driven with one, never charged `causal_mask_missing`.
pinyin.py: a Llama whose model hands each block `yanma` (掩码), added to the scores, and whose
config is a module-level dict with a key check has no size for (its rotary base, kept at the
file's); filled.py: a GPT-2 block handed a 0/1 `causal` that its attention fills by."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.context import used_as_mask
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_mask_by_use"
KINDS = {"pinyin.py": ["mha", "block", "gpt"], "filled.py": ["causal_attention", "block"]}


@pytest.fixture(scope="module")
def results():
    out = {}
    for name, kinds in KINDS.items():
        result = check_file(str(HERE / name), only=kinds)
        out[name] = ({c.kind: c.status for c in result.components}, format_report(result))
    return out


@pytest.mark.parametrize("name", list(KINDS))
def test_a_mask_handed_by_the_model_is_found_by_its_use(results, name):
    status, report = results[name]
    assert status == dict.fromkeys(KINDS[name], "pass"), report
    assert "causal_mask_missing" not in report, report


def test_the_files_config_dict_gives_what_check_has_no_size_for(results):
    status, report = results["pinyin.py"]
    assert status["gpt"] == "pass", report


@pytest.mark.parametrize("source, name, mask", [
    ("scores = scores + yanma", "yanma", True), ("att += m", "m", True),
    ("att = att.masked_fill(causal[:, :, :T, :T] == 0, -1e9)", "causal", True),
    ("w = torch.where(zhezhao, w, -1e9)", "zhezhao", True),
    ("scores += position_bias", "position_bias", False), ("h = x + attn_out", "attn_out", False),
    ("scores = scores + self.future[:T, :S]", "self", False),
    ("attn_output = attn_output + hidden_states", "hidden_states", False),  # GPT-NeoX's serial residual
    ("attn_output = attn_output + x", "x", False), ("attn_weights = attn_weights + am", "am", True)])
def test_a_mask_is_what_is_added_to_the_scores_or_filled_by(source, name, mask):
    assert used_as_mask(source, name) is mask
