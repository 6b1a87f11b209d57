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
from handformer.check.core.report import format_report

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
