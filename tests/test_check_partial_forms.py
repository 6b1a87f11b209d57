"""Forms check read wrongly and so FAILed on correct files, each read right now in two forms:

- partial rotary set by a config share (learners_partial_rotary/): litgpt's rotary_percentage = 0.25 of
  check's 4 dims a head turned 1 dim, an odd width no rotation has, so a correct attention, block and
  model departed. A config's rotary share, whatever its name, is built at half a head: a fused q/k/v by
  key/value group with the tables handed in (a dataclass config), and one fused per head with the angles
  made inside (a plain settings class), both pass; a planted mistake in each FAILs named at its line.
- a rotary table handed as the angles themselves (learners_angle_tables/): lucidrains' `rotary_pos_emb`
  (T, Dh) whose cos and sin the attention takes; halves' pairing (torch.cat([freqs, freqs])) and pairs'
  (repeat_interleave with rotate_every_two) are both read, by the shift that leaves RoPE's output as it
  was; their plants FAIL at their lines. A model whose layers are lists of pre-norm wrappers reads its
  GEGLU's gate (the second half) from the learner's file, not torch.nn's, and passes.
- a generation loop whose count is the total length (learners_total_count/), under a name check does
  not know (litgpt's max_returned_tokens over a torch.empty buffer, a while loop's total_len): handed
  the prompt's length plus the new tokens; a buffer made unset is judged by no view, so a plant in the
  loop FAILs at its own line.

One module-scoped check run per file, shared by the asserts on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
ATTENTION_ONLY = ["causal_attention"]
FILES = {
    "learners_partial_rotary/grouped.py": ["causal_attention", "block", "gpt"],
    "learners_partial_rotary/grouped_kv_swapped.py": ATTENTION_ONLY,
    "learners_partial_rotary/per_head.py": ["causal_attention", "gpt"],
    "learners_partial_rotary/per_head_rotation_sign.py": ATTENTION_ONLY,
    "learners_angle_tables/halves.py": ["causal_attention", "ffn", "gpt"],
    "learners_angle_tables/halves_heads_merged_inside_out.py": ATTENTION_ONLY,
    "learners_angle_tables/pairs.py": ATTENTION_ONLY,
    "learners_angle_tables/pairs_rotation_sign.py": ATTENTION_ONLY,
    "learners_total_count/buffer.py": ["generate"],
    "learners_total_count/buffer_fill_zero.py": ["generate"],
    "learners_total_count/while_total.py": ["generate"],
    "learners_total_count/while_total_first_position.py": ["generate"],
}
RUNS: dict[str, object] = {}


def run(name: str):
    if name not in RUNS:
        RUNS[name] = check_file(str(FIXTURES / name), only=FILES[name])
    return RUNS[name]


def statuses(name: str) -> dict[str, str]:
    return {c.name: c.status for c in run(name).components}


@pytest.mark.parametrize(("name", "expected", "note"), [
    ("learners_partial_rotary/grouped.py", {"GroupedAttention": "pass", "Block": "pass", "GPT": "pass"},
     "on the first 2 dims of each head"),
    ("learners_partial_rotary/per_head.py", {"NeoxAttention": "pass", "NeoxModel": "pass"},
     "on the first 2 dims of each head"),
    ("learners_angle_tables/halves.py", {"Attention": "pass", "GEGLU": "pass", "GPT": "pass"}, "pairs (j, j + d/2)"),
    ("learners_angle_tables/pairs.py", {"SelfAttention": "pass"}, "interleaved pairs (2j, 2j+1)"),
    ("learners_total_count/buffer.py", {"generate": "pass"}, "its max_returned_tokens counts the prompt too"),
    ("learners_total_count/while_total.py", {"generate": "pass"}, "its total_len counts the prompt too"),
])
def test_correct_forms_pass_checked(name, expected, note):
    assert statuses(name) == expected, format_report(run(name))
    assert note in format_report(run(name))
    assert all(check.ok for c in run(name).components for check in c.checks), format_report(run(name))


@pytest.mark.parametrize(("name", "component", "mistake", "line"), [
    ("learners_partial_rotary/grouped_kv_swapped.py", "GroupedAttention", "kv_swapped", 66),
    ("learners_partial_rotary/per_head_rotation_sign.py", "NeoxAttention", "rope_rotation_sign", 22),
    ("learners_angle_tables/halves_heads_merged_inside_out.py", "Attention", "departs", 47),
    ("learners_angle_tables/pairs_rotation_sign.py", "SelfAttention", "rope_rotation_sign", 18),
    ("learners_total_count/buffer_fill_zero.py", "generate", "departs", 16),
    ("learners_total_count/while_total_first_position.py", "generate", "departs", 9),
])
def test_plants_fail_at_their_line(name, component, mistake, line):
    comp = next(c for c in run(name).components if c.name == component)
    assert comp.status == "fail", format_report(run(name))
    assert (comp.findings[0].name, comp.findings[0].line) == (mistake, line), format_report(run(name))
