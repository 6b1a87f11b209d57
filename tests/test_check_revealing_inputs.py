"""Inputs and states that reveal a mistake (runners/lora.py, core/signatures.py, core/discovery.py).

A LoRA layer is built with dropout 0.5 and graded in eval mode: two eval runs that differ leave its
dropout on (dropout_in_eval, at the dropout's line). A merge() that raises on the layer it was built
around fails at the raising line, never passes as if it had not run. A private function that builds a
causal mask (CLIP's `_build_causal_attention_mask`, cut in place with `triu_`) is graded as its own
component; one handed the length of a cache before it (`past_key_values_length`) is handed none, and
one handed a number of heads builds a bias per head (ALiBi's), no mask, and is left alone. Two forms
each: loralib's (wraps a Linear, factors (r, in), (out, r), F.dropout) and one that builds its Linear
from sizes (factors (in, r), (r, out), nn.Dropout); an additive float mask and a boolean one (and
Hugging Face's older `_make_causal_mask`). ALiBi's slopes are graded at 6 heads too (not a power of
two: the heads past 4 take every other slope of 8), as a list of slopes (the paper's recursive
get_slopes, its lists traced) and as BLOOM's bias slope * position (build_alibi_tensor(attention_mask,
num_heads, dtype)), each planted wrong for those heads alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_revealing"
KINDS = {"lora_loralib": "lora", "lora_sizes": "lora", "mask_additive": "causal_mask", "mask_boolean": "causal_mask",
         "mask_past": "causal_mask", "alibi_recursive": "alibi_slopes", "alibi_bias": "alibi_slopes"}
# planted file -> (the finding it gives, or None for a raise; the planted line)
PLANTS = {"lora_loralib_eval": ("dropout_in_eval", 24), "lora_sizes_eval": ("dropout_in_eval", 21),
          "lora_loralib_merge": (None, 33), "lora_sizes_merge": (None, 27),
          "mask_additive_planted": ("causal_off_by_one", 9), "mask_boolean_planted": ("causal_off_by_one", 7),
          "mask_past_planted": ("causal_off_by_one", 9), "alibi_recursive_planted": ("departs", 14),
          "alibi_bias_planted": ("departs", 13)}


def _kind(name: str) -> str:
    return KINDS[name.rsplit("_", 1)[0] if name not in KINDS else name]


@pytest.fixture(scope="module")
def results():
    out = {}
    for name in [*KINDS, *PLANTS]:
        result = check_file(str(HERE / f"{name}.py"), only=[_kind(name)])
        out[name] = (result.components, format_report(result))
    return out


@pytest.mark.parametrize("name", list(KINDS))
def test_a_correct_file_passes_with_its_component_found(results, name):
    """mask_past.py's _alibi_mask(n_head, max_pos) is no causal mask: one component."""
    components, report = results[name]
    assert [(c.kind, c.status) for c in components] == [(KINDS[name], "pass")], report


@pytest.mark.parametrize("name", list(PLANTS))
def test_a_planted_file_fails_at_the_planted_line(results, name):
    components, report = results[name]
    finding, line = PLANTS[name]
    assert [c.status for c in components] == ["fail"], report
    if finding is None:  # raised in the merge, quoted at its line
        assert components[0].error.where.startswith("merge"), report
        assert any(t.startswith(f"line {line},") for t in components[0].error.traceback), report
    else:
        assert (finding, line) in [(f.name, f.line) for f in components[0].findings], report


def test_lora_is_graded_in_eval_mode(results):
    assert "eval mode is deterministic" in results["lora_sizes"][1]
