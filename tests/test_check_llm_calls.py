"""`handformer check` on decoder-only LLM parts called as their public code calls them:

- CS336's attention, forward(x, token_positions=None) (learners_cs336/): the optional positions are
  left to the attention, never handed an input;
- litgpt's attention, forward(x, cos, sin, mask) with its config's n_query_groups (learners_litgpt/):
  the causal mask is its caller's, so it is checked with the masks handed, built with key/value groups;
- gpt-fast's sample(logits) of logits[0, -1], returning (token, probs) (learners_gptfast/);
- DeepSeek's MoE whose top-k weights are scaled by route_scale, not renormalized (learners_deepseek_moe/);
- BERT's Attention(hidden, heads): `hidden` is the width where nothing else names it (learners_bert/);
- a rotary module with its base written in (learners_rope_base/), compared at that base;
- Raschka's model with a dict config it keeps, rope_base (learners_raschka/): its tables at another base.

One module-scoped check run per file, shared by the asserts on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
RUNS: dict[str, object] = {}
ONLY = {"learners_raschka/rope_wrong_base_model.py": ["gpt"]}


def run(name: str):
    if name not in RUNS:
        RUNS[name] = check_file(str(FIXTURES / name), only=ONLY.get(name))
    return RUNS[name]


def statuses(name: str) -> dict[str, str]:
    return {c.name: c.status for c in run(name).components}


def finding(name: str, component: str) -> tuple[str, int | None, str]:
    comp = next(c for c in run(name).components if c.name == component)
    assert comp.findings, format_report(run(name))
    return comp.findings[0].name, comp.findings[0].line, (comp.findings[0].code or "").strip()


@pytest.mark.parametrize(("name", "expected", "note"), [
    ("learners_cs336/attention.py", {"MultiHeadSelfAttention": "pass", "RotaryPositionalEmbedding": "pass"},
     "interleaved pairs"),
    ("learners_litgpt/attention.py", {"CausalSelfAttention": "pass", "apply_rope": "pass"},
     "its caller hands the causal mask"),
    ("learners_gptfast/sample.py", {"sample": "pass"}, "logits[0, -1] (gpt-fast's)"),
    ("learners_deepseek_moe/route_scale.py", {"MoE": "pass"}, "the routed experts' weights times 2.5"),
    ("learners_bert/attention_hidden.py", {"Attention": "pass"}, "matches handformer's MultiHeadAttention"),
    ("learners_rope_base/correct.py", {"RotaryEmbedding": "pass"}, "uses its own, 500000: compared at that"),
])
def test_correct_llm_parts_pass_checked(name, expected, note):
    assert statuses(name) == expected, format_report(run(name))
    assert exit_code(run(name)) == 0
    assert note in format_report(run(name))
    checks = [check.ok for c in run(name).components for check in c.checks]
    assert checks and all(checks)


@pytest.mark.parametrize(("name", "component", "expected"), [
    ("learners_litgpt/kv_repeat_order.py", "CausalSelfAttention",
     ("kv_repeat_order", 46, "k = k.repeat(1, q_per_kv, 1, 1)")),
    ("learners_rope_base/rope_wrong_base.py", "RotaryEmbedding",
     ("rope_wrong_base", 10, "inv_freq = 1.0 / (500000.0 ** (torch.arange(0, dim // 2).float() / dim))")),
    ("learners_raschka/rope_wrong_base_model.py", "Llama3Model",
     ("rope_wrong_base", 13, "inv_freq = 1.0 / theta_base ** (torch.arange(0, head_dim // 2).float() / head_dim)")),
])
def test_llm_plants_fail_named_at_their_line(name, component, expected):
    assert statuses(name)[component] == "fail", format_report(run(name))
    assert exit_code(run(name)) == 1
    assert finding(name, component) == expected
