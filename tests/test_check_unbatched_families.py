"""`handformer check` on learner files written as the public 2025-26 code is, where it departs from the
batched (B, T, D) layout check drives by default or from the reference's conventions:

- gpt-oss as OpenAI's torch model.py is (learners_gpt_oss_unbatched/): one sequence, x (T, D)
  everywhere, RotaryEmbedding.forward(query, key) with the tokens on dim 0, sinks and a sliding window,
  a generate loop calling int(torch.argmax(logits, -1)) on model(tokens)[-1];
- DeepSeek-V3 as its inference/model.py is (learners_deepseek_moe/): an embedding class of its own,
  the last position's logits (B, V), a mixture of experts with a Gate of its own;
- minbpe (learners_minbpe_ties/): ties to the pair counted first, max(stats, key=stats.get), minbpe's
  own convention, and a base class holding an empty pattern.

One module-scoped check run per file, shared by the asserts on it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report
from handformer.check.reference import bpe_reference as R

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
RUNS: dict[str, object] = {}


def run(name: str):
    if name not in RUNS:
        RUNS[name] = check_file(str(FIXTURES / name))
    return RUNS[name]


def statuses(name: str) -> dict[str, str]:
    return {c.name: c.status for c in run(name).components}


def findings(name: str, component: str) -> list[tuple[str, int | None, str]]:
    comp = next(c for c in run(name).components if c.name == component)
    return [(f.name, f.line, (f.code or "").strip()) for f in comp.findings]


# --- gpt-oss, one sequence at a time -----------------------------------------------------------------

GPT_OSS = "learners_gpt_oss_unbatched"


def test_gpt_oss_unbatched_passes_with_every_component_checked():
    name = f"{GPT_OSS}/correct.py"
    assert statuses(name) == {"RotaryEmbedding": "pass", "RMSNorm": "pass", "TransformerBlock": "pass",
                              "Transformer": "pass", "generate": "pass"}, format_report(run(name))
    assert exit_code(run(name)) == 0
    report = format_report(run(name))
    assert "inputs (T, H, Dh), one sequence at a time" in report
    assert "a sliding window on blocks [0]: each sees its last 3 tokens" in report


@pytest.mark.parametrize(("plant", "components", "finding", "code"), [
    ("sink_not_in_softmax", ["TransformerBlock", "Transformer"], "sink_not_in_softmax",
     "weights = torch.softmax(scores, dim=-1)"),
    ("rope_sign", ["RotaryEmbedding", "TransformerBlock", "Transformer"], "rope_rotation_sign",
     "return torch.cat((a * cos + b * sin, b * cos - a * sin), dim=-1)"),
    ("window_off_by_one", ["TransformerBlock"], None,
     'mask = mask + torch.tril(Q.new_full((n, n), float("-inf")), diagonal=-sliding_window - 1)'),
])
def test_gpt_oss_unbatched_plants_fail_at_their_line(plant, components, finding, code):
    name = f"{GPT_OSS}/{plant}.py"
    assert exit_code(run(name)) == 1
    for component in components:
        assert statuses(name)[component] == "fail", format_report(run(name))
        found = findings(name, component)
        assert found and found[0][2] == code and (finding is None or found[0][0] == finding), found


# --- DeepSeek: an embedding of its own, the last position's logits, a mixture of experts --------------

DEEPSEEK = "learners_deepseek_moe"
DEEPSEEK_PARTS = {"MLA": "pass", "apply_rotary_emb": "pass", "precompute_freqs_cis": "pass", "MLP": "pass",
                  "MoE": "pass", "RMSNorm": "pass", "Block": "pass"}


def test_deepseek_last_position_logits_are_compared_there():
    name = f"{DEEPSEEK}/dense.py"
    assert statuses(name) == {**DEEPSEEK_PARTS, "Transformer": "pass"}, format_report(run(name))
    report = format_report(run(name))
    assert "forward returns the last position's logits only: compared there" in report
    assert "embed -> token embedding" in report


def test_deepseek_moe_model_is_compared_with_its_gate_as_the_router():
    """Its layer 1 routes through a Gate whose (E, D) weight is the router: compared on every block."""
    name = f"{DEEPSEEK}/moe.py"
    assert statuses(name) == {**DEEPSEEK_PARTS, "Transformer": "pass"}, format_report(run(name))
    assert exit_code(run(name)) == 0


@pytest.mark.parametrize("plant", ["final_norm_missing", "first_position"])
def test_deepseek_model_plants_fail(plant):
    name = f"{DEEPSEEK}/{plant}.py"
    assert statuses(name) == {**DEEPSEEK_PARTS, "Transformer": "fail"}, format_report(run(name))


# --- minbpe: ties to the pair counted first ---------------------------------------------------------

MINBPE = "learners_minbpe_ties"


def test_minbpe_ties_to_the_pair_counted_first_differ_by_convention():
    name = f"{MINBPE}/correct.py"
    assert statuses(name) == {"BasicTokenizer": "differs", "RegexTokenizer": "differs"}, format_report(run(name))
    assert exit_code(run(name)) == 0
    report = format_report(run(name))
    assert "ties go to the pair counted first, minbpe's max(stats, key=stats.get)" in report
    assert "has no pre-tokenizer" in report  # the base class's empty pattern is none


@pytest.mark.parametrize(("plant", "finding", "code"), [
    ("ties_last_counted", "bpe_ties_not_by_bytes", "pair = sorted(stats, key=stats.get)[-1]"),
    ("decode_strict", "bpe_decode_strict", 'return b"".join(parts).decode("utf-8")'),
    ("chunks_joined", "bpe_merges_across_pretokens", 'chunks = [list(text.encode("utf-8"))]'),
])
def test_minbpe_plants_fail_at_their_line(plant, finding, code):
    name = f"{MINBPE}/{plant}.py"
    assert statuses(name) == {"BasicTokenizer": "differs", "RegexTokenizer": "fail"}, format_report(run(name))
    assert findings(name, "RegexTokenizer")[0] == (finding, findings(name, "RegexTokenizer")[0][1], code)


def test_replay_reads_each_tie_rule():
    """The rule the ties of some merges followed: the greater pair, the smaller, the one counted first
    (the order of the counts), or none of them."""
    words = Counter({(b"c", b"d"): 1, (b"a", b"b"): 1})  # (c, d) counted first, (a, b) smaller
    assert R.replay(words, [(b"c", b"d")]) == (None, "greater")  # greater is checked first: it is also first
    assert R.replay(words, [(b"a", b"b")]) == (None, "smaller")
    words = Counter({(b"b", b"c"): 1, (b"a", b"b"): 1, (b"c", b"d"): 1})
    assert R.replay(words, [(b"b", b"c")]) == (None, "first")
    assert R.replay(Counter({(b"a", b"b"): 1, (b"c", b"d"): 1, (b"b", b"c"): 1}), [(b"b", b"c")]) == (None, "other")
