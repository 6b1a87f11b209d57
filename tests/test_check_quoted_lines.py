"""A FAIL quotes the line the mistake is on: the line the first departing tensor is computed on, found
from what departs, not from what a mistake looks like. Each plant edits one line of a fixture and the
FAIL's findings must quote that line: a decoding loop whose model parts from itself on the cached path
(the line inside the model, under the loop's call); a helper right in another call (the line calling
it); a named mistake whose patterns match several lines of the class (the one that departs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.localize import commented_out
from handformer.check.core.report import format_report
from handformer.check.core.result import ComponentResult, Finding, text
from handformer.check.core.source import first_line
from handformer.check.reference.diagnoses import CATALOG

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"


def _quoted(tmp_path: Path, source: Path, old: str, new: str, kind: str, more: tuple[tuple[str, str], ...] = (),
            ) -> tuple[set[int], int, str]:
    """The lines the FAIL of `kind` quotes, the planted line (the last line of `new`), and the report;
    `more`: edits that are not the mistake (a helper the planted line sits in)."""
    planted = edited_copy(tmp_path, source, [*more, (old, new)])
    mark = new.splitlines()[-1].strip()
    line = next(i for i, text in enumerate(Path(planted).read_text().splitlines(), 1) if mark in text)
    result = check_file(planted, only=[kind])
    fails = [c for c in result.components if c.status == "fail"]
    return {f.line for c in fails for f in c.findings}, line, format_report(result)


def test_a_cached_loop_quotes_the_model_line_where_the_cached_path_parts(tmp_path):
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_kvcache" / "correct.py",
                                     "self.future[start:start + t, :k.size(2)]", "self.future[:t, :k.size(2)]",
                                     "generate")
    assert lines == {planted}, report
    assert "in a helper called from line" in report, report


@pytest.mark.parametrize("old, new, form", [
    ("logits = logits[:, -1, :]  # (B, C)", "logits = logits[:, 0, :]  # (B, C)", "position 0 of"),
    ("probs = F.softmax(logits, dim=-1)", "probs = F.softmax(logits, dim=0)", "over the batch, dim 0")])
def test_a_loop_that_hands_its_model_the_whole_context_departs_in_its_own_lines(tmp_path, old, new, form):
    """Karpathy's generate calls the model on the whole (cropped) context each step, no cache: the
    model's calls are not judged as cached ones (each would seem to part from the last), the loop's
    own line is quoted with the form of the difference."""
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_karpathy" / "correct.py", old, new,
                                     "generate")
    assert lines == {planted} and form in report and "in a helper called from" not in report, report
    assert ("sampling_softmax_wrong_dim" in report) == ("dim=0" in new), report  # the catalogue's name


def test_a_mask_function_s_mistake_is_quoted_in_it_not_where_another_function_reads_masks(tmp_path):
    """A mask function that returns its mask compared the wrong way (`return mask == 0`): the mistake
    is its own line, though the attention's `masked_fill(mask == 0, ...)` matches a pattern of
    mask_inverted first; a mistake is looked for in the component's own code first."""
    lines, planted, report = _quoted(
        tmp_path, FIXTURES / "learners" / "correct.py",
        "    return torch.tril(torch.ones(size, size, dtype=torch.int64), diagonal=0)",
        "    mask = torch.tril(torch.ones(size, size, dtype=torch.int64), diagonal=0)\n    return mask == 0",
        "causal_mask")
    assert lines == {planted} and "mask_inverted" in report, report


def test_a_residual_saved_after_the_norm_is_quoted_where_it_is_saved(tmp_path):
    """Raschka's block with `shortcut = x` moved below `x = self.norm1(x)`: the sum `x + shortcut`
    departs, but the operand that holds the wrong sub-step (the normed input) was bound above it."""
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_raschka" / "correct.py",
                                     "        shortcut = x\n        x = self.norm1(x)\n",
                                     "        x = self.norm1(x)\n        shortcut = x\n", "block")
    assert lines == {planted} and "residual_from_normed" in report, report  # the line `shortcut = x`


def test_labels_made_like_the_decoder_input_are_quoted_where_the_labels_are_made(tmp_path):
    """`tgt_in = tgt[:, :-1]` then `tgt_out = tgt[:, :-1]`: both hold what the loss was handed; the
    labels are the later slice, made after the decoder's input."""
    lines, planted, report = _quoted(
        tmp_path, FIXTURES / "learners_training" / "correct.py",
        "    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]  # each position predicts the next token",
        "    tgt_in = tgt[:, :-1]\n    tgt_out = tgt[:, :-1]", "train_step")
    assert lines == {planted} and "the decoder's input" in report, report


def test_a_comparison_written_for_an_assignment_is_quoted(tmp_path):
    """`true_dist[:, self.padding_idx] == 0` does nothing: the pad column keeps its smoothing; the
    finding's patterns find the line beside it, the statement that does nothing is quoted."""
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_carried" / "correct.py",
                                     "true_dist[:, self.padding_idx] = 0", "true_dist[:, self.padding_idx] == 0",
                                     "loss")
    assert lines == {planted} and "smoothing_on_pad" in report, report


def test_a_loop_that_continues_at_eos_is_quoted_at_its_continue(tmp_path):
    """`if next_word == end_symbol: continue`, where `break` was meant: the statement that lets the
    loop go on is the line quoted, not the loop's `torch.cat`."""
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_carried" / "correct.py",
                                     "            break", "            continue", "greedy_decode")
    assert lines == {planted} and "greedy_no_stop_at_eos" in report, report


def test_a_shared_helper_given_the_wrong_weights_quotes_the_line_that_calls_it(tmp_path):
    """One RMSNorm class normalizes q and k: k through q's norm departs inside the norm's forward, yet
    the same forward gave the reference's q; the line calling it is quoted."""
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_minimind_qk" / "correct.py",
                                     "self.q_norm(xq), self.k_norm(xk)", "self.q_norm(xq), self.q_norm(xk)", "gqa")
    assert lines == {planted}, report


def test_a_named_mistake_matching_several_lines_is_quoted_where_the_heads_depart(tmp_path):
    """A helper splitting the heads in two `.view(..., n_heads, ...)` lines, the second viewing the
    first as (B, h, T, d_k): both look like split_no_transpose; the second is where the heads depart."""
    helper = ("    def split(self, x, batch_size):\n"
              "        x = x.view(batch_size, -1, self.n_heads, self.d_k)\n"
              "        return x.transpose(1, 2)\n\n    def forward(self, q, k, v, mask=None):")
    calls = [(f"{n} = self.w_{n.lower()}({n.lower()}).view(batch_size, -1, self.n_heads, self.d_k).transpose(1, 2)",
              f"{n} = self.split(self.w_{n.lower()}({n.lower()}), batch_size)") for n in "QKV"]
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners" / "correct.py", "return x.transpose(1, 2)",
                                     "return x.view(batch_size, self.n_heads, -1, self.d_k)", "mha",
                                     (("    def forward(self, q, k, v, mask=None):", helper), *calls))
    assert lines == {planted} and "split_no_transpose" in report, report


QUOTED = FIXTURES / "learners_quoted" / "correct.py"
TORCH_LAYERS = FIXTURES / "learners_torch_layers" / "correct.py"
SCORES = "logits = q @ k.transpose(-2, -1) * (w // self.n_heads) ** -0.5"


def test_a_scale_bound_on_its_own_line_is_quoted_there_not_where_it_is_used(tmp_path):
    """`scale = 1.0 / d` two lines above `q @ k.T * scale`: the factor the scores are off by is that
    number, so the line that bound it is the mistake (named by the catalogue: scale_by_dk)."""
    lines, planted, report = _quoted(tmp_path, QUOTED, "scale = (w // self.n_heads) ** -0.5",
                                     "scale = 1.0 / (w // self.n_heads)", "causal_attention",
                                     ((SCORES, "scale = (w // self.n_heads) ** -0.5\n"
                                               "        logits = q @ k.transpose(-2, -1) * scale"),))
    assert lines == {planted} and "scale_by_dk" in report, report


def test_queries_and_keys_unpacked_in_the_wrong_order_are_quoted_at_the_unpacking(tmp_path):
    """`k, q, v = ...split(...)`: the scores come out transposed further on; the line quoted is the one
    whose `k` holds the queries."""
    lines, planted, report = _quoted(tmp_path, QUOTED, "q, k, v = self.qkv(h).split(w, dim=-1)",
                                     "k, q, v = self.qkv(h).split(w, dim=-1)", "causal_attention")
    assert lines == {planted} and "roles of q, k and v swapped" in report, report


def test_a_greedy_decode_reading_the_first_position_is_quoted_where_it_reads_it(tmp_path):
    lines, planted, report = _quoted(tmp_path, TORCH_LAYERS, "model.generator(out[:, -1])",
                                     "model.generator(out[:, 0])", "greedy_decode")
    assert lines == {planted} and "at position 0 of 2" in report, report


def test_an_embedding_scaled_by_d_model_is_quoted_where_it_is_scaled(tmp_path):
    """The factor d_model is read against the model's width (not the length of the positions it
    builds), so the line that multiplies is quoted, not the one that stored self.d_model."""
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_karpathy" / "correct.py",
                                     "tok_emb = self.token_embedding_table(idx)  # (B, T, C)",
                                     "tok_emb = self.token_embedding_table(idx) * self.d_model", "gpt",
                                     (("self.lm_head = nn.Linear(n_embd, vocab_size)",
                                       "self.lm_head = nn.Linear(n_embd, vocab_size)\n        self.d_model = n_embd"),))
    assert lines == {planted} and "= d_model" in report, report


def test_a_part_handed_the_wrong_input_is_quoted_where_it_is_handed(tmp_path):
    """`self.expand(h)` where the block normalizes first: the part, a class of the file no check grades
    by its name, gives the reference's FFN output when handed the norm, so the line handing it `h` is
    quoted, not the line inside the part that returns."""
    lines, planted, report = _quoted(tmp_path, QUOTED, "h = h + self.expand(self.pre_expand(h))",
                                     "h = h + self.expand(h)", "block",
                                     (("class FeedForward(", "class Grow("), ("FeedForward(d_model)", "Grow(d_model)")))
    assert lines == {planted}, report


def test_queries_scaled_before_their_product_are_the_reference_s_step(tmp_path):
    """`q = q * d_k ** -0.5` before `q @ kᵀ` (DistilBERT's, OPT's) is a step of the reference, not where
    the computation parts: the weights applied to k are."""
    lines, planted, report = _quoted(tmp_path, QUOTED, "mixed = logits.softmax(dim=-1) @ v",
                                     "mixed = logits.softmax(dim=-1) @ k", "causal_attention",
                                     ((SCORES, "q = q * (w // self.n_heads) ** -0.5\n"
                                               "        logits = q @ k.transpose(-2, -1)"),))
    assert lines == {planted}, report


def test_a_missing_residual_is_quoted_at_the_norm_line_that_departs(tmp_path):
    """Two `norm(` lines the same pattern of no_residual finds: the one that departs is quoted."""
    ffn = "self.dropout(self.linear2(F.relu(self.linear1(x))))"
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_hidden" / "correct.py",
                                     "return self.norm2(x + y)", "return self.norm2(y)", "encoder_layer",
                                     ((f"return self.norm2(x + {ffn})", f"y = {ffn}\n        return self.norm2(x + y)"),))
    assert lines == {planted} and "no_residual" in report, report


def test_positions_counted_per_row_are_the_reference_s_positions(tmp_path):
    """A mask of ones made for every row and positions counted from it, (B, T) (OPT's, HF's): no
    departure; the line that adds the embeddings wrong is quoted."""
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_karpathy" / "correct.py",
                                     "x = tok_emb + pos_emb", "x = tok_emb - pos_emb", "gpt",
                                     (("pos_emb = self.position_embedding_table(torch.arange(T, device=idx.device))",
                                       "keep = torch.ones_like(idx)  # (B, T)\n"
                                       "        pos_emb = self.position_embedding_table(keep.cumsum(-1) - 1)"),))
    assert lines == {planted}, report


@pytest.mark.parametrize(("name", "source", "wrong"), [
    ("mask_inverted", "if mask is not None:\n    s = torch.where(mask, -1e9, s)\n", 2),
    ("mask_hides_queries", "def forward(self, q, mask):\n    shape = (bs, 1, k_length, 1)\n", 2)])
def test_a_mask_s_patterns_pass_over_the_lines_that_only_name_it(name, source, wrong):
    """`if mask is not None:` and `def forward(..., mask)` name the mask; the line that uses it wrong is quoted."""
    lines = list(enumerate(source.splitlines(), 1))
    assert first_line(CATALOG[name].patterns, lines)[0] == wrong


def test_a_number_is_not_spread_over_a_row_of_the_loss(tmp_path):
    """A (V,) table of one smoothing value made before the log-probabilities: no view of the loss's
    numbers spread over a row stands for it; the softmax in place of the log-softmax is quoted."""
    logp = "logp = torch.log_softmax(logits, dim=-1)"
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_localize" / "correct.py", logp,
                                     "logp = torch.softmax(logits, dim=-1)", "loss",
                                     ((logp, f"spread = torch.full((logits.size(-1),), smoothing)\n    {logp}"),))
    assert lines == {planted}, report


def test_a_stack_of_q_k_and_v_is_not_judged_against_one_of_them_spread(tmp_path):
    """q, k and v kept stacked as one (3, B, H, T, Dh) tensor, the output projection's weight used
    untransposed: the stack is no copy of q's heads spread over three rows; the line that departs is the
    output's."""
    stacked = ("        proj = qkv.permute(2, 0, 3, 1, 4)  # (3, b, H, n, Dh)\n"
               "        q, k, v = proj[0], proj[1], proj[2]")
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_more_styles" / "patch_block.py",
                                     "return self.to_out(mixed)",
                                     "return mixed @ self.to_out.weight + self.to_out.bias", "mha",
                                     (("        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (b, H, n, Dh)",
                                       stacked),))
    assert lines == {planted}, report


def test_a_target_distribution_filled_with_the_wrong_share_is_quoted_at_the_fill(tmp_path):
    """The smoothing spread over size - 1 columns while the pad column is zeroed too: under the reading
    that zeroes the pad column the fill is the one wrong line, under the one that keeps smoothing on it
    the zeroing is; the line that writes a whole row's share (the fill) is quoted, not the pad column's."""
    lines, planted, report = _quoted(tmp_path, TORCH_LAYERS, "self.smoothing / (self.size - 2)",
                                     "self.smoothing / (self.size - 1)", "loss")
    assert lines == {planted}, report


def test_a_named_mistake_beside_a_commented_out_statement_is_quoted_there(tmp_path):
    """`# loss = loss / accum_steps` above `loss.backward()`: the one statement of the function the
    learner commented out binds the loss the finding's line reads; it is the line quoted."""
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_loop" / "correct.py",
                                     "        (loss / accum_steps).backward()\n",
                                     "        # loss = loss / accum_steps\n        loss.backward()\n",
                                     "train_step")
    assert lines == {planted - 1} and "train_step_loss_not_divided" in report, report


def test_a_formula_in_a_comment_is_no_statement_turned_off(tmp_path):
    """`# S = QK^T / sqrt(d_k), shape [...]` above `S = q @ kᵀ` reads names no code of the file uses: a
    formula, not a statement commented out; the finding stays at its line."""
    path = tmp_path / "learner.py"
    path.write_text("def attention(q, k):\n    # S = QK^T / sqrt(d_k), shape [bs, heads, T, T]\n"
                    "    S = q @ k.transpose(-1, -2)\n    return S.softmax(-1)\n")
    res = ComponentResult("sdpa", "attention", findings=[Finding("no_scaling", text("", ""), 3, "S = q @ k")])
    commented_out(res, str(path))
    assert res.findings[0].line == 3


def test_the_statement_that_does_nothing_is_read_in_the_innermost_function_around_the_finding(tmp_path):
    """Each function's idle statements are read once a file: the finding moves to the nearest one of the
    innermost function around its line (a function nested in it included; never one of another)."""
    path = tmp_path / "learner.py"
    path.write_text("def loss(x, t):\n    t == 0\n\n    def inner(y):\n        y * 2\n        return y\n"
                    "    x == 3\n    return inner(x) - t\n\n\ndef other(z):\n    z == 1\n    return z\n")
    found = [Finding("smoothing_on_pad", text("", ""), n, "") for n in (6, 3, 13)]
    res = ComponentResult("loss", "loss", findings=found)
    commented_out(res, str(path))
    assert [(f.line, f.code) for f in res.findings] == [(5, "y * 2"), (2, "t == 0"), (12, "z == 1")]


def test_a_maximum_over_the_batch_axis_is_quoted_where_it_is_taken(tmp_path):
    """min-p's top probability taken over dim=0: a (1, V) tensor, no view's shape; it is the maximum of
    the probabilities over the wrong axis, the line that takes it departs."""
    threshold = "threshold = min_p * probs.max(dim=-1, keepdim=True).values"
    lines, planted, report = _quoted(tmp_path, FIXTURES / "learners_sampling" / "correct.py",
                                     "probs.amax(dim=-1, keepdim=True)", "probs.amax(dim=0, keepdim=True)", "min_p",
                                     ((threshold, "top = probs.amax(dim=-1, keepdim=True)\n"
                                                  "    threshold = min_p * top"),))
    assert lines == {planted}, report
