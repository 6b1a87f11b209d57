"""A FAIL quotes the planted line where the mistake is written in a form the catalogue's variants do
not reproduce, or where the line that computes wrongly is not the one the output departs at: one
learner file per form (tests/fixtures/learners_quoted_forms/), each checked once, its planted line
marked `# planted`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report, to_json

FIXTURES = Path(__file__).parent / "fixtures" / "learners_quoted_forms"
PLANTS = {  # file -> (the failing component, the finding it names, the lines it quotes)
    # the exponent's sign dropped: no variant's table at float32, still sines and cosines of the
    # positions at frequencies of their own
    "pe_sign": ("PositionalEncoding", "pe_wrong_frequency", [14]),
    # Whisper's divisor channels - 1: the exp's line and the line that made the factor it reads
    "pe_timescales": ("sinusoids", "pe_wrong_frequency", [9, 8]),
    # the temperature passed as d_k where the helper is built: the division's line and the call's
    "attn_temperature": ("MultiHeadAttention", "scale_by_dk", [14, 29]),
    # the scale taken out, its statement left as `scores = scores`
    "attn_noop": ("CausalSelfAttention", "no_scaling", [26]),
    # a pre-norm block whose MLP sublayer is post-norm: both sublayers' lines
    "vit_block": ("Block", "pre_norm", [45, 46]),
    # a loop's top-k (its default k = 10) that fills the others with 0, and one (run with top_k = 1)
    # that drops the k-th token too: the traced run's filtered logits are the catalogued mistake's
    "topk_fill_zero": ("generate", "filter_fill_finite", [14]),
    "topk_drops_kth": ("generate", "top_k_off_by_one", [14]),
    # an encoder-decoder model that builds its masks, its components each right: the target's causal
    # mask sees the next token, or the decoder hands each layer the masks in the other order
    "s2s_mask_sees_next": ("Transformer", "causal_off_by_one", [131]),
    "s2s_masks_swapped": ("Transformer", "decoder_masks_swapped", [109]),
    # greedy decoding of a batch of one that takes the max over the batch: every new token 0
    "greedy_batch_dim": ("greedy_decode", "argmax_wrong_dim", [15]),
}
CORRECT = {"correct": 3, "s2s_correct": 6}  # file -> its components, each to pass


def _checked(name: str) -> tuple[dict, str]:
    result = check_file(str(FIXTURES / f"{name}.py"))
    return json.loads(to_json(result)), format_report(result)


@pytest.mark.parametrize("name", list(CORRECT))
def test_the_correct_file_passes(name):
    data, report = _checked(name)
    assert [c["status"] for c in data["components"]] == ["pass"] * CORRECT[name], report


@pytest.mark.parametrize("name", list(PLANTS))
def test_the_plant_fails_named_at_its_line(name):
    component, finding, lines = PLANTS[name]
    data, report = _checked(name)
    failing = {c["name"]: c["findings"] for c in data["components"] if c["status"] == "fail"}
    assert [f["name"] for f in failing.get(component, [])] == [finding], report
    found = failing[component][0]
    quoted = [found["line"]] + [int(n) for n in re.findall(r" / line (\d+):", found["code"])]
    assert quoted == lines, report
    source = (FIXTURES / f"{name}.py").read_text().splitlines()
    assert any("# planted" in source[n - 1] for n in lines), report
