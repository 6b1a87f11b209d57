"""`handformer check` on three modern decoder styles with windows, groups and caches of their own:

- Gemma 2 (the Hugging Face port): an attention that builds its own causal mask in a sliding window
  on its local layers and soft-caps its scores is checked alone under the window it measures; a rotary
  module that takes one row of positions (T,) is handed them so; a window off by one fails at the line
  that bands the mask; a sandwich norm left out is quoted at the add that takes the un-normed output;
- lit-gpt (TinyLlama): padded_vocab_size is the vocabulary; a fused qkv grouped per query group whose
  split swaps k and v is read as grouped, and kv_swapped is named at the split;
- Mistral (mistral-src): a rolling KV cache class of the file, made with the model's config, is driven
  one token at a time after the prompt; rotary positions that ignore start_pos are named rope_no_offset;
  a window mask off by one fails at its line, against the model's sliding_window."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
GEMMA2 = FIXTURES / "learners_gemma2_local" / "correct.py"
LITGPT = FIXTURES / "learners_litgpt_groups" / "correct.py"
MISTRAL = FIXTURES / "learners_mistral_rolling" / "correct.py"


def planted(tmp_path: Path, source: Path, old: str, new: str, only: list[str]):
    return check_file(edited_copy(tmp_path, source, [(old, new)]), only=only)


def only_finding(result, component: str):
    comp = next(c for c in result.components if c.name == component)
    assert comp.status == "fail", format_report(result)
    return comp.findings


@pytest.fixture(scope="module")
def gemma2():
    return check_file(str(GEMMA2), only=["causal_attention", "rope", "gpt"])


def test_gemma2_local_attention_and_its_rotary_module_pass(gemma2):
    status = {c.name: c.status for c in gemma2.components}
    assert status == {"GemmaTwoAttention": "pass", "RotaryEmbedding": "pass", "GemmaTwoForCausalLM": "pass"}, (
        format_report(gemma2))
    attention = gemma2.components[0]
    notes = " ".join(n["en"] for n in attention.notes)
    assert "each token sees its last 3 tokens" in notes and "50 * tanh(scores / 50)" in notes, notes


def test_gemma2_window_off_by_one_fails_the_attention_at_its_line(tmp_path):
    result = planted(tmp_path, GEMMA2, "triu(1 - self.window)", "triu(-self.window)", ["causal_attention"])
    (finding,) = only_finding(result, "GemmaTwoAttention")
    assert finding.code == "keep = keep & torch.ones(T, T, dtype=torch.bool).triu(-self.window)", finding


def test_gemma2_missing_sandwich_norm_is_quoted_at_its_add(tmp_path):
    result = planted(tmp_path, GEMMA2, "        h = self.post_feedforward_layernorm(h)\n", "", ["block"])
    (finding,) = only_finding(result, "GemmaTwoLayer")
    assert (finding.name, finding.line, finding.code) == ("sandwich_norm_missing", 116, "x = x + h"), finding


def test_gemma2_unscaled_embedding_is_quoted_where_it_is_kept(tmp_path):
    old = "        h = embeds * torch.tensor(self.config.hidden_size ** 0.5, dtype=embeds.dtype)\n"
    new = ("        scale = torch.tensor(self.config.hidden_size ** 0.5, dtype=embeds.dtype)\n"
           "        h = embeds\n")
    (finding,) = only_finding(planted(tmp_path, GEMMA2, old, new, ["gpt"]), "GemmaTwoForCausalLM")
    assert (finding.name, finding.code) == ("embedding_scale_unused", "h = embeds"), finding


def test_litgpt_padded_vocabulary_and_grouped_qkv_pass():
    result = check_file(str(LITGPT), only=["gpt"])
    assert [c.status for c in result.components] == ["pass"], format_report(result)


def test_litgpt_grouped_split_with_k_and_v_swapped_is_named(tmp_path):
    result = planted(tmp_path, LITGPT, "q, k, v = qkv.split(", "q, v, k = qkv.split(", ["causal_attention"])
    (finding,) = only_finding(result, "CausalSelfAttention")
    assert (finding.name, finding.code) == ("kv_swapped", "q, v, k = qkv.split((q_per_kv, 1, 1), dim=2)"), finding


@pytest.fixture(scope="module")
def mistral():
    return check_file(str(MISTRAL), only=["block", "gpt"])


def test_mistral_block_and_model_through_its_rolling_cache_pass(mistral):
    assert [(c.name, c.status) for c in mistral.components] == [
        ("TransformerBlock", "pass"), ("Transformer", "pass")], format_report(mistral)
    checks = [c.name["en"] for c in mistral.components[1].checks if c.ok]
    assert any("through its cache (RollingCache)" in label for label in checks), checks


def test_mistral_positions_that_ignore_start_pos_are_named(tmp_path):
    old = "rope_tables(torch.arange(start_pos, start_pos + T),"
    findings = only_finding(planted(tmp_path, MISTRAL, old, "rope_tables(torch.arange(T),", ["gpt"]), "Transformer")
    assert [f.name for f in findings] == ["rope_no_offset"], findings


def test_mistral_window_mask_off_by_one_fails_at_its_line(tmp_path):
    old, new = "(pos[None, :] > pos[:, None] - window)", "(pos[None, :] >= pos[:, None] - window)"
    findings = only_finding(planted(tmp_path, MISTRAL, old, new, ["gpt"]), "Transformer")
    assert findings[0].code == "seen = (pos[None, :] <= pos[:, None]) & (pos[None, :] >= pos[:, None] - window)"
