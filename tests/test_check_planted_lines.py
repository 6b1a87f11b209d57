"""A FAIL quotes the line that was planted and names the catalogued mistake: learner files in five
styles (a Chinese tutorial's training step with label smoothing, a nanoGPT-like loop with
accumulation, Raschka's and BERT's attention, a lucidrains stack of vectors, Meta's Llama with its
generate loop), each correct as written, each plant one edit of it. The plants are the mistakes that
once FAILed with another line quoted, or with the right line and no name."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"

# plant: (fixture folder, kinds checked, (old, new), the finding's name, the planted line's text, a
# second line the quote must hold, or "")
PLANTS = {
    "labels_not_moved_on": ("learners_s2s_step", ["loss", "train_step"],
                            ("gold = tgt[:, 1:]", "gold = tgt[:, :-1]"), "train_step_no_shift",
                            "gold = tgt[:, :-1]", ""),
    "divided_by_sentences": ("learners_s2s_step", ["loss", "train_step"],
                             ("gold.reshape(-1)) / n_real", "gold.reshape(-1)) / src.size(0)"),
                             "loss_mean_over_batch", "/ src.size(0)", ""),
    "lm_labels_are_inputs": ("learners_nanogpt_accum", ["lm_train_step"],
                             ("windows[:, :-1], windows[:, 1:]", "windows[:, :-1], windows[:, :-1]"),
                             "train_step_no_shift", "inputs, targets = windows[:, :-1], windows[:, :-1]", ""),
    "cosine_without_floor": ("learners_nanogpt_accum", ["schedule"],
                             ("return min_lr + factor * (learning_rate - min_lr)", "return factor * learning_rate"),
                             "cosine_min_lr_ignored", "return factor * learning_rate", ""),
    "heads_not_moved_back": ("learners_raschka_heads", ["causal_attention"],
                             ("heads = (weights @ v).transpose(1, 2)", "heads = weights @ v"),
                             "concat_no_transpose", "merged = heads.contiguous().view(b, n, self.d_out)",
                             "heads = weights @ v"),
    "softmax_over_queries": ("learners_raschka_heads", ["mha"],
                             ("probs = nn.functional.softmax(scores, dim=-1)",
                              "probs = nn.functional.softmax(scores, dim=-2)"),
                             "softmax_wrong_dim", "probs = nn.functional.softmax(scores, dim=-2)", ""),
    "bert_output_no_residual": ("learners_raschka_heads", ["mha"],
                                ("self.LayerNorm(hidden_states + input_tensor)", "self.LayerNorm(hidden_states)"),
                                "no_residual", "hidden_states = self.LayerNorm(hidden_states)", ""),
    "stack_ff_no_residual": ("learners_vector_stack", ["gpt"], ("x = ff(x) + x", "x = ff(x)"), "no_residual",
                             "x = ff(x)", ""),
    "stack_attn_no_residual": ("learners_vector_stack", ["gpt"], ("x = attn(x) + x", "x = attn(x)"),
                               "no_residual", "x = attn(x)", ""),
    "rope_table_negated": ("learners_llama_loop", ["rope"],
                           ("torch.polar(torch.ones_like(freqs), freqs)", "torch.polar(torch.ones_like(freqs), -freqs)"),
                           "rope_rotation_sign", "return torch.polar(torch.ones_like(freqs), -freqs)", ""),
    "start_never_moves": ("learners_llama_loop", ["generate"], ("        prev_pos = cur_pos\n", ""),
                          "generate_prefix_refed", "tokens[:, cur_pos] = next_token",
                          "logits = model.forward(tokens[:, prev_pos:cur_pos], prev_pos)"),
    "start_update_commented_out": ("learners_llama_loop", ["generate"],
                                   ("        prev_pos = cur_pos\n", "        # prev_pos = cur_pos\n"),
                                   "generate_prefix_refed", "# prev_pos = cur_pos", ""),
    "position_written_wrong": ("learners_llama_loop", ["generate"],
                               ("tokens[:, prev_pos:cur_pos], prev_pos)", "tokens[:, prev_pos:cur_pos], cur_pos - 1)"),
                               "generate_cache_mismatch",
                               "logits = model.forward(tokens[:, prev_pos:cur_pos], cur_pos - 1)", ""),
}
STYLES = sorted({plant[0] for plant in PLANTS.values()})


@pytest.mark.parametrize("style", STYLES)
def test_each_style_passes_as_written(style):
    kinds = sorted({kind for folder, kinds, *_ in PLANTS.values() if folder == style for kind in kinds})
    result = check_file(str(FIXTURES / style / "correct.py"), only=kinds)
    assert result.components and all(c.status == "pass" for c in result.components), format_report(result)


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_plant_fails_named_at_its_line(tmp_path, plant):
    style, kinds, edit, name, planted, second = PLANTS[plant]
    path = edited_copy(tmp_path, FIXTURES / style / "correct.py", [edit])
    lines = Path(path).read_text().splitlines()
    number = next(i + 1 for i, text in enumerate(lines) if text.strip().endswith(planted))
    result = check_file(path, only=kinds)
    report = format_report(result)
    found = [f for c in result.components if c.status == "fail" for f in c.findings if f.name == name]
    assert found and all(f.line == number for f in found), report
    if second:  # two lines quoted, the second one named by its number
        other = next(i + 1 for i, text in enumerate(lines) if text.strip() == second)
        assert all(f.code.count(" / line ") == 1 and f"/ line {other}: {second}" in f.code for f in found), report
