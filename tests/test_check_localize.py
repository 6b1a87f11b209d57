"""`check` localizes what its catalogue has no name for: mistakes planted into a correct learner
attention that no catalogued mistake reproduces FAIL with a note naming the first departing step,
quoting the planted line, and the form of the difference; the correct file still passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report
from handformer.check.core.result import DEPARTS

pytestmark = pytest.mark.usefixtures("one_thread")

CORRECT = '''import math

import torch
from torch import nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, q, k, v, mask=None):
        B, T, D = q.shape
        Q = self.W_q(q).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_k(k).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(v).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        weights = torch.softmax(scores, dim=-1)
        out = (weights @ V).transpose(1, 2).contiguous().view(B, T, D)
        return self.W_o(out)
'''

# (what the correct line says, the planted line, the step named, the form of the difference)
PLANTS = {
    "fourth_root_scale": ("/ math.sqrt(self.d_k)", "/ self.d_k ** 0.25", "`scores`",
                          "q·kᵀ times a constant factor 0.7071 = 1/d_k**0.25"),
    "sign": ("scores = Q @ K", "scores = -Q @ K", "`scores`",
             "the scores q·kᵀ/sqrt(d_k) with its sign flipped"),
    "extra_residual": ("return self.W_o(out)", "return self.W_o(out) + q", "`return`",
                       "the output plus an extra term equal to the input x"),
    "softmax_over_batch": ("dim=-1)", "dim=0)", "`weights`", "a softmax over dim=0"),
}
# the forms the catalogue names (the finding named so, at the departing line, its observation the
# localizer's): a softmax over another axis is softmax_wrong_dim; labels not moved on, train_step_no_shift
NAMED_NOW = {"softmax_over_batch": "softmax_wrong_dim", "train_step_labels_not_moved_on": "train_step_no_shift"}
# the same forms in the Chinese report: the reference's intermediate results named in Chinese
ZH_FORMS = {"sign": "分数 q·kᵀ/sqrt(d_k) 的符号反了", "extra_residual": "输出多了一项：输入 x"}


def _check(path):
    result = check_file(str(path))
    (comp,) = result.components
    return comp, format_report(result), format_report(result, "zh")


def test_correct_attention_passes_without_a_departure(tmp_path):
    path = tmp_path / "attention.py"
    path.write_text(CORRECT)
    comp, report, _ = _check(path)
    assert comp.status == "pass", report
    assert "parts from the reference" not in report


@pytest.mark.parametrize("name", PLANTS)
def test_unnamed_mistake_is_localized(tmp_path, name):
    old, new, step, form = PLANTS[name]
    assert CORRECT.count(old) == 1
    source = CORRECT.replace(old, new)
    number, planted = next((i + 1, ln.strip()) for i, ln in enumerate(source.splitlines()) if new in ln)
    path = tmp_path / "attention.py"
    path.write_text(source)
    comp, report, zh = _check(path)
    assert comp.status == "fail" and [f.name for f in comp.findings] == [NAMED_NOW.get(name, DEPARTS)], report
    (note,) = [f.observed for f in comp.findings]
    assert f"{step} at line {number}: {planted}" in note["en"], report
    assert form in note["en"], report
    assert f"第 {number} 行" in note["zh"] and planted in zh
    assert ZH_FORMS.get(name, "") in note["zh"], note["zh"]
    quoted = [ln.strip() for ln in source.splitlines() if len(ln.strip()) > 20 and ln.strip() in note["en"]]
    assert quoted == [planted]  # one line quoted: a diagnosis, not a listing


# The other kinds, in tests/fixtures/learners_localize/correct.py: (kind, the correct line, the planted
# line, the step named, the form of the difference)
KIND_PLANTS = {
    "ffn_product_halved": ("ffn", "hidden = gate * self.up_proj(x)", "hidden = gate * self.up_proj(x) / 2",
                           "`hidden`", "silu(gate(x)) * up(x) times a constant factor 0.5 = 1/2"),
    "ffn_extra_residual": ("ffn", "return self.linear2(F.relu(self.linear1(x)))",
                           "return self.linear2(F.relu(self.linear1(x))) + x", "`return`",
                           "the output down(...) plus an extra term equal to the input x"),
    "rmsnorm_one_plus_gain": ("rmsnorm", "return self.weight * normed", "return (1 + self.weight) * normed",
                              "`return`", "the gain times the normalized x plus an extra term equal to x / rms(x)"),
    "layernorm_scaled": ("layernorm", "x_hat = (x - mean) / torch.sqrt(var + self.eps)",
                         "x_hat = (x - mean) / torch.sqrt(var + self.eps) / math.sqrt(x.size(-1))", "`x_hat`",
                         "times a constant factor 0.25 = 1/sqrt(d_model)"),
    "layer_attention_halved": ("encoder_layer", "x = self.norm1(x + self.dropout(attn))",
                               "x = self.norm1(x + 0.5 * self.dropout(attn))", "`the input of self.norm1`",
                               "x + self-attention (the residual sum) plus -0.5 × (the self-attention's output)"),
    "layer_extra_residual": ("encoder_layer", "x = self.norm2(x + self.dropout(ffn))",
                             "x = self.norm2(x + self.dropout(ffn)) + x", "`x`",
                             "the norm after the FFN plus an extra term equal to the norm after the self-attention"),
    "loss_smoothing_summed": ("loss", "smooth = -logp.mean(dim=-1)", "smooth = -logp.sum(dim=-1)", "`smooth`",
                              "the smoothing term -mean(log p) times a constant factor 7 = V"),
    "loss_ignore_inverted": ("loss", "mask = (targets != pad_idx).float()", "mask = (targets == pad_idx).float()",
                             "`mask`", "the real-token mask (1 = a real target), inverted (1 - it)"),
    "causal_mask_transposed": ("causal_mask", "return future == 0", "return future.T == 0", "`return`",
                               "the causal mask (1 where key s <= query t) transposed (its last two axes swapped)"),
}
KINDS_FILE = Path(__file__).parent / "fixtures" / "learners_localize" / "correct.py"


def test_correct_parts_pass_without_a_departure():
    result = check_file(str(KINDS_FILE))
    report = format_report(result)
    assert {c.kind for c in result.components} >= {"ffn", "rmsnorm", "layernorm", "encoder_layer", "loss",
                                                    "causal_mask"}
    assert all(c.status == "pass" for c in result.components), report
    assert "parts from the reference" not in report


@pytest.mark.parametrize("name", KIND_PLANTS)
def test_unnamed_mistake_in_each_kind_is_localized(tmp_path, name):
    kind, old, new, step, form = KIND_PLANTS[name]
    correct = KINDS_FILE.read_text()
    assert correct.count(old) == 1
    source = correct.replace(old, new)
    number, planted = next((i + 1, ln.strip()) for i, ln in enumerate(source.splitlines()) if new in ln)
    path = tmp_path / "learner.py"
    path.write_text(source)
    result = check_file(str(path), only=[kind])
    report, zh = format_report(result), format_report(result, "zh")
    failed = [c for c in result.components if c.status == "fail"]
    assert len(failed) == 1 and not failed[0].named(), report
    (note,) = [f.observed for f in failed[0].findings if f.name == DEPARTS]
    assert f"{step} at line {number}: {planted}" in note["en"], report
    assert form in note["en"], report
    assert f"第 {number} 行" in note["zh"] and planted in zh


def test_a_norm_applied_to_another_sub_step_is_named_with_the_norms_own_input():
    from handformer.check.core.fingerprint import randn
    from handformer.check.core.localize import form_of
    from handformer.check.core.localize_kinds import layer_norm_forms, layer_views
    from handformer.check.reference import variants as V

    x = randn(2, 5, 8, seed=1)

    def linear(n_out, n_in, seed):
        return randn(n_out, n_in, seed=seed) / n_in ** 0.5, randn(n_out, seed=seed + 1)

    attention = V.MHAWeights(*(linear(8, 8, 10 * i) for i in range(1, 5)), n_heads=2)
    ffn = V.FFNWeights(linear(16, 8, 50), linear(8, 16, 60))
    norms = [V.NormWeights(1 + randn(8, seed=70 + i) / 4, randn(8, seed=80 + i), 1e-5) for i in range(2)]
    for placement in ("post", "pre"):
        w = V.LayerWeights(attention, ffn, norms, placement=placement)
        views = layer_views(w, x, None, None)
        forms = layer_norm_forms(w, views)
        # the FFN's norm applied to the input x: post-norm's belongs to x + FFN, pre-norm's to x + attn
        form = form_of(V.norm(w.norms[1], x), views, {}, forms=forms)["en"]
        side, own = {"post": ("after", "FFN"), "pre": ("before", "self-attention")}[placement]
        assert form == (f"the norm {side} the FFN applied to the input x; the reference applies it to x + {own} "
                        "(the residual sum)"), form


# Grouped-query attention with rotary positions, in the LLM chapter's style (half-split pairs,
# rotate_half) and Meta's (complex freqs_cis, interleaved pairs), with mistakes no catalogued one
# reproduces: (fixture, the correct line, the planted line, what the note must say, the form or None).
# A step inside a helper of theirs (rotate_half, apply_rotary_emb) is quoted with the planted line
# that called it: two lines at most.
FIXTURES = Path(__file__).parent / "fixtures"
ROTARY_PLANTS = {
    "half_rope_on_values": ("learners_llm", "        q, k = apply_rotary_pos_emb(q, k, cos, sin)\n",
                            "        v, _ = apply_rotary_pos_emb(v, v, cos, sin)\n",
                            "`return` at line 41: return torch.cat((-x2, x1), dim=-1) (in a helper called from line",
                            None),
    "gqa_extra_residual": ("learners_llm", "        return self.o_proj(out)\n", "        return self.o_proj(out) + x\n",
                           "`return` at line", "the output plus an extra term equal to the input x"),
    "meta_rope_on_values": ("learners_llama", "        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)\n",
                            "        xv, _ = apply_rotary_emb(xv, xv, freqs_cis=freqs_cis)\n",
                            "`xq_out` at line 60: xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3) "
                            "(in a helper called from line", None),
    "meta_weights_halved": ("learners_llama", "scores = F.softmax(scores.float(), dim=-1).type_as(xq)\n",
                            "scores = F.softmax(scores.float(), dim=-1).type_as(xq) / 2\n", "`scores` at line",
                            "the attention weights times a constant factor 0.5"),
}


@pytest.mark.parametrize("name", ROTARY_PLANTS)
def test_unnamed_mistake_in_rotary_grouped_attention_is_localized(tmp_path, name):
    family, old, new, step, form = ROTARY_PLANTS[name]
    correct = (FIXTURES / family / "correct.py").read_text()
    assert correct.count(old) == 1
    source = correct.replace(old, old + new if new.lstrip().startswith(("v, _", "xv, _")) else new)
    number, planted = next((i + 1, ln.strip()) for i, ln in enumerate(source.splitlines()) if ln.strip() == new.strip())
    path = tmp_path / "learner.py"
    path.write_text(source)
    result = check_file(str(path), only=["gqa"])
    report = format_report(result)
    (comp,) = [c for c in result.components if c.kind == "gqa" and "repeat" not in c.name]
    assert comp.status == "fail" and not comp.named(), report
    (note,) = [f.observed for f in comp.findings if f.name == DEPARTS]
    assert step in note["en"] and f"line {number}: {planted}" in note["en"], report
    assert form is None or form in note["en"], report
    assert f"第 {number} 行" in note["zh"] and planted in note["zh"]
    quoted = [ln.strip() for ln in source.splitlines() if len(ln.strip()) > 20 and ln.strip() in note["en"]]
    assert planted in quoted and len(quoted) <= 2  # the planted line, and the helper's line at most


# The rotary apply functions checked alone (kind rope), each style: (fixture, the correct line, the
# planted line, the step named, the form or None).
APPLY_PLANTS = {
    "half_k_cos_twice": ("learners_llm", "k * cos + rotate_half(k) * sin", "k * cos + rotate_half(k) * cos",
                         "`return[1]` at line", None),
    "half_q_halved": ("learners_llm", "return q * cos + rotate_half(q) * sin,",
                      "return (q * cos + rotate_half(q) * sin) / 2,", "`return[0]` at line",
                      "q rotated (half pairs) times a constant factor 0.5 = 1/2"),
    # a result that is its input, never rotated: judged as the result, at the line that left it as is
    "half_q_returned_as_is": ("learners_llm", "return q * cos + rotate_half(q) * sin,", "return q,",
                              "`return[0]` at line", "it is q: the steps after it are left out"),
    "meta_q_bound_as_is": ("learners_llama", "xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)",
                           "xq_out = xq  # rotated further down", "`xq_out` at line",
                           "it is q (B, T, H, Dh): the steps after it are left out"),
}


@pytest.mark.parametrize("name", APPLY_PLANTS)
def test_unnamed_mistake_in_a_rotary_apply_function_is_localized(tmp_path, name):
    family, old, new, step, form = APPLY_PLANTS[name]
    correct = (FIXTURES / family / "correct.py").read_text()
    assert correct.count(old) == 1
    source = correct.replace(old, new)
    number, planted = next((i + 1, ln.strip()) for i, ln in enumerate(source.splitlines()) if new in ln)
    path = tmp_path / "learner.py"
    path.write_text(source)
    result = check_file(str(path), only=["rope"])
    report = format_report(result)
    failed = [c for c in result.components if c.status == "fail"]
    assert len(failed) == 1 and not failed[0].named(), report
    (note,) = [f.observed for f in failed[0].findings if f.name == DEPARTS]
    assert f"{step} {number}: {planted}" in note["en"], report
    assert form is None or form in note["en"], report
    quoted = [ln.strip() for ln in source.splitlines() if len(ln.strip()) > 20 and ln.strip() in note["en"]]
    assert quoted == [planted]


def test_keys_alone_turned_the_other_way_are_named_at_their_line(tmp_path):
    """Meta's keys times the conjugated table turn back while the queries turn forward:
    rope_rotation_sign in its keys' form, at the line that conjugates."""
    correct = (FIXTURES / "learners_llama" / "correct.py").read_text()
    old = "xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)"
    new = "xk_out = torch.view_as_real(xk_ * freqs_cis.conj()).flatten(3)"
    source = correct.replace(old, new)
    number = next(i + 1 for i, ln in enumerate(source.splitlines()) if new in ln)
    path = tmp_path / "learner.py"
    path.write_text(source)
    result = check_file(str(path), only=["rope"])
    (failed,) = [c for c in result.components if c.status == "fail"]
    assert [(f.name, f.form, f.line) for f in failed.findings] == [("rope_rotation_sign", "k", number)], (
        format_report(result))


# The line of a catalogued mistake, in the forms learners write it: (diagnosis, the form found, their
# lines, the line quoted, the form shown). Scores divided by sqrt(d_model) give the output of
# scale_by_dk at check's sizes (d_k = 4 = sqrt(16)): the line says which one it is.
LINES = {
    "einsum_unscaled": ("no_scaling", "", ["q = self.wq(x)", 'att = torch.einsum("bqhd,bkhd->bhqk", q, k)',
                                           "att = att.softmax(dim=-1)"], 2, ""),
    "var_unbiased": ("layernorm_unbiased_std", "var", ["self.eps = 1e-5", "mean = x.mean(-1, keepdim=True)",
                                                      "var = x.var(dim=-1, keepdim=True, unbiased=True)"], 3, "var"),
    "expand_repeat_order": ("kv_repeat_order", "", ["def repeat_kv(x, n_rep):",
                                                    "return x[:, :, None].expand(b, t, n_rep, n_kv, d).flatten(2, 3)"],
                            2, ""),
    "top_p_crossing": ("top_p_drops_crossing", "", ["probs_sum = torch.cumsum(probs_sort, dim=-1)",
                                                    "mask = probs_sum > p"], 2, ""),
    "sqrt_d_model": ("scale_by_dk", "", ["attn_scores = queries @ keys.transpose(2, 3)",
                                         "w = torch.softmax(attn_scores / self.d_out ** 0.5, dim=-1)"], 2,
                     "sqrt_d_model"),
    "heads_times_width": ("scale_by_dk", "", ["att = q @ k.transpose(-2, -1) / math.sqrt(self.h * self.d_head)"],
                          1, "sqrt_d_model"),
    "scale_kept_from_the_width": ("scale_by_dk", "", ["self.scaling = config.hidden_size ** -0.5",
                                                      "w = torch.matmul(q, k.transpose(2, 3)) * self.scaling"],
                                  1, "sqrt_d_model"),
    "scale_kept_from_the_head": ("scale_by_dk", "", ["self.scaling = config.head_dim ** -0.5",
                                                     "scores = q @ k.transpose(-2, -1) / self.d_k"], 2, ""),
    "input_pos_of_a_cached_step": ("generate_cache_mismatch", "", [
        "model.setup_caches(max_batch_size=B, max_seq_length=T_new)", "input_pos = torch.arange(0, T)",
        "input_pos = torch.tensor([T - 1])"], 3, ""),
    "top_p_crossing_on_the_call": ("top_p_drops_crossing", "", [
        "mass_before = torch.cumsum(probs, dim=-1) - probs", "remove = torch.cumsum(probs, dim=-1) > p"], 2, ""),
    "divided_by_d_k": ("scale_by_dk", "", ["scores = q @ k.transpose(-2, -1) / self.d_k",
                                           "x = self.emb(ids) * math.sqrt(self.d_model)"], 1, ""),
    "causal_on_two_lines": ("causal_off_by_one", "", ["scores = scores + torch.triu(",
                                                      'torch.full((T, T), float("-inf")), diagonal=2)',
                                                      "return scores.softmax(-1)"], 1, ""),
}


@pytest.mark.parametrize("case", LINES)
def test_a_catalogued_mistake_is_located_at_the_line_that_writes_it(case):
    from handformer.check.core.source import locate_form

    name, found, lines, number, shown = LINES[case]
    form, line, code = locate_form(name, found, list(enumerate(lines, start=1)))
    whole = lines[number - 1] + (f" / line {number + 1}: {lines[number:] and lines[number]}" * lines[number - 1].endswith("("))
    assert (line, code, form) == (number, whole, shown)  # a statement of two lines quoted whole


# The Annotated Transformer's LabelSmoothing builds its target distribution in place (fill, scatter,
# zero the padding): the line that departs is the one whose values last to the end and are wrong.
SMOOTHING = '''import torch
from torch import nn


class LabelSmoothing(nn.Module):
    def __init__(self, size, padding_idx, smoothing=0.0):
        super().__init__()
        self.criterion = nn.KLDivLoss(reduction="sum")
        self.padding_idx, self.confidence, self.smoothing, self.size = padding_idx, 1.0 - smoothing, smoothing, size

    def forward(self, x, target):
        true_dist = x.data.clone()
        true_dist.fill_(self.smoothing / (self.size - 2))
        true_dist.scatter_(1, target.data.unsqueeze(1), self.confidence)
        true_dist[:, self.padding_idx] = 0
        mask = torch.nonzero(target.data == self.padding_idx)
        if mask.numel() > 0:
            true_dist.index_fill_(0, mask.squeeze(), 0.0)
        return self.criterion(x, true_dist.clone().detach())
'''


def test_a_distribution_built_in_place_is_localized_at_the_line_that_writes_it_wrong(tmp_path):
    planted = "true_dist.fill_(self.smoothing / self.size)"
    source = SMOOTHING.replace("true_dist.fill_(self.smoothing / (self.size - 2))", planted)
    path = tmp_path / "learner.py"
    path.write_text(source)
    (comp,) = check_file(str(path), only=["loss"]).components
    assert comp.status == "fail" and not comp.named()
    (note,) = [f.observed for f in comp.findings if f.name == DEPARTS]
    assert f"`true_dist` at line 13: {planted}" in note["en"], note
    assert "the line writes 0.01429 where the target distribution q (flattened) has 0.02" in note["en"], note


# Kinds localized by their own sub-steps, each from a correct file with one line changed: (the
# fixture or source, the kind, the correct line, the planted line, the step named, the form). The
# masks a masked softmax builds, the constants a positional table is built from (positions in whole
# numbers), a filter's renormalization, a reduction over another axis.
TOP_K = '''import torch


def top_k_probs(probs, k):
    vals, idx = torch.topk(probs, min(k, probs.size(-1)), dim=-1)
    out = torch.zeros_like(probs).scatter(-1, idx, vals)
    return out / out.sum(dim=-1, keepdim=True)
'''
TRAIN_STEP = '''def train_step(model, batch, optimizer, criterion):
    src, tgt = batch
    model.train()
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    logits = model(src, tgt_in)
    loss = criterion(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
'''
GELU_FFN = '''import math

import torch
from torch import nn


class GELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(
            math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(d_model, d_ff), GELU(), nn.Linear(d_ff, d_model))

    def forward(self, x):
        return self.layers(x)
'''
D2L = FIXTURES / "learners_d2l" / "correct.py"
SUB_STEP_PLANTS = {
    "valid_length_keeps_one_more": (D2L, "masked_softmax", "< valid_len[:, None]", "<= valid_len[:, None]",
                                    "`keep` at line", "with one key more visible in 15 rows (the key at the "
                                    "mask's edge): a mask off by one position"),
    "table_positions_from_one": (D2L, "positional_encoding", "angles = torch.arange(max_len, dtype",
                                 "angles = torch.arange(1, max_len + 1, dtype", "`angles` at line",
                                 "the angles pos·freq shifted by one position: position i holds the reference's "
                                 "i + 1"),
    "top_k_renormalized_over_the_batch": (TOP_K, "top_k", "out / out.sum(dim=-1, keepdim=True)", "out / out.sum()",
                                          "`return` at line", "a normalization (divided by the sum) over all "
                                          "entries at once"),
    "top_p_first_row_kept": (FIXTURES / "learners_sampling" / "correct.py", "top_p", "remove[..., 0] = False",
                             "remove[0] = False", "`remove` at line",
                             "the tokens removed (1 = removed), except at index 0 of dim=0: it differs there alone"),
    "add_norm_on_the_sublayer_output": (D2L, "add_norm", "return self.ln(self.dropout(Y) + X)",
                                        "return self.ln(self.dropout(Y)) + X", "`self.ln(...)` at line",
                                        "the norm applied to Y, the sublayer's output; the reference applies it to "
                                        "X + Y (the residual sum)"),
    "top_p_cumsum_over_the_batch": (FIXTURES / "learners_sampling" / "correct.py", "top_p",
                                    "torch.cumsum(probs, dim=-1)", "torch.cumsum(probs, dim=0)", "`mass_above` at line",
                                    "the cumulative sum (the mass above each token) over dim=0; the reference's runs "
                                    "over the last axis"),
    "log_softmax_over_the_length": (KINDS_FILE, "loss", "logp = torch.log_softmax(logits, dim=-1)",
                                    "logp = torch.log_softmax(logits, dim=1)", "`logp` at line",
                                    "the log-softmax over dim=1; the reference's runs over the last axis"),
    "rope_table_positions_from_one": (FIXTURES / "learners_llama" / "correct.py", "rope",
                                      "t = torch.arange(end, device=freqs.device)",
                                      "t = torch.arange(1, end + 1, device=freqs.device)", "`t` at line",
                                      "the positions 0 .. L-1 plus a constant 1"),
    "rope_table_cos_in_pairs": (FIXTURES / "learners_minimind" / "correct.py", "rope",
                                "torch.cat([torch.cos(freqs), torch.cos(freqs)], dim=-1)",
                                "torch.repeat_interleave(torch.cos(freqs), 2, dim=-1)", "`freqs_cos` at line",
                                "are in different layouts, one as halves [c, c] and one as pairs"),
    "train_step_labels_not_moved_on": (TRAIN_STEP, "train_step",
                                       "tgt[:, :-1], tgt[:, 1:]", "tgt[:, :-1], tgt[:, :-1]", "`tgt_out` at line",
                                       "the labels are the decoder's input tgt[:, :-1]"),
    "gelu_constant_in_their_own_class": (GELU_FFN, "ffn", "0.044715", "0.44715",
                                         "`self.layers.1(...)` at line 9: return 0.5 * x * (1 + torch.tanh( / line",
                                         ""),
    "scale_by_a_size_read_wrong": (CORRECT.replace("scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)",
                                                   "d_k = Q.size(-1)\n        scores = Q @ K.transpose(-2, -1) / "
                                                   "math.sqrt(d_k)"), "mha", "d_k = Q.size(-1)", "d_k = Q.size(-2)",
                                   "(its `d_k` was read at line", "q·kᵀ times a constant factor 0.4472 = 1/sqrt(T)"),
    "gpt_final_norm_inside_the_loop": (FIXTURES / "learners_nanogpt" / "correct.py", "gpt",
                                       "x = block(x)", "x = self.ln_f(block(x))",
                                       "`self.ln_f(...)` at line", ""),
    # a part of the learner's own inside a torch container (nn.Sequential): the model's localization goes into it
    "model_embedding_in_a_sequential": ((FIXTURES / "learners_model" / "correct.py").read_text().replace(
        "self.src_embed = Embeddings(src_vocab, d_model)",
        "self.src_embed = nn.Sequential(Embeddings(src_vocab, d_model))"), "transformer",
        "return self.lut(x) * self.scale", "return self.lut(x) * self.scale * self.scale", "`return` at line",
        "times a constant factor 4"),
    # a number kept on self in __init__ that the departing line uses: quoted where it is set
    "smoothing_confidence_set_in_init": (FIXTURES / "learners_carried" / "correct.py", "loss",
                                         "self.confidence = 1.0 - smoothing", "self.confidence = 1.0",
                                         "(its `self.confidence` was set at line", "the line writes 1 where"),
    # a head size read from the heads' axis: right at check's 4 heads of 4, found at 2 heads of 8
    "scale_by_the_heads_axis": (FIXTURES / "learners_nanogpt" / "correct.py", "causal_attention",
                                "math.sqrt(k.size(-1))", "math.sqrt(k.size(1))", "`att` at line",
                                "times a constant factor 2"),
    "layernorm_mean_over_all": (KINDS_FILE, "layernorm", "mean = x.mean(-1, keepdim=True)", "mean = x.mean()",
                                "`mean` at line", "the mean of the input x over all entries at once"),
    "layernorm_mean_over_tokens": (KINDS_FILE, "layernorm", "mean = x.mean(-1, keepdim=True)",
                                   "mean = x.mean(1, keepdim=True)", "`mean` at line",
                                   "the mean of the input x over dim=1; the reference reduces over dim=-1"),
    "lm_step_loss_summed": (FIXTURES / "learners_cache" / "correct.py", "lm_train_step",
                            "y.reshape(-1))", 'y.reshape(-1), reduction="sum")', "`loss` at line",
                            "the loss, the mean cross-entropy times a constant factor 12 = B·T"),
    "generate_crops_one_short": (FIXTURES / "learners_sampling" / "correct.py", "generate", "idx[:, -block_size:]",
                                 "idx[:, -block_size + 1:]", "`idx_cond` at line",
                                 "the last 7 tokens; the context is the last 8 (the block size)"),
    "cosine_factor_without_its_half": (FIXTURES / "learners_training" / "correct.py", "schedule",
                                       "0.5 * (1 + math.cos(math.pi * progress))",
                                       "(1 + math.cos(math.pi * progress))", "`return` at line",
                                       "is the cosine factor × (max_lr - min_lr) times a constant factor 2"),
}


@pytest.mark.parametrize("name", SUB_STEP_PLANTS)
def test_unnamed_mistake_in_a_kinds_sub_steps_is_localized(tmp_path, name):
    source, kind, old, new, step, form = SUB_STEP_PLANTS[name]
    correct = source.read_text() if isinstance(source, Path) else source
    assert correct.count(old) == 1
    planted = correct.replace(old, new)
    number, line = next((i + 1, ln.strip()) for i, ln in enumerate(planted.splitlines()) if new in ln)
    path = tmp_path / "learner.py"
    path.write_text(planted)
    result = check_file(str(path), only=[kind])
    report = format_report(result)
    (comp,) = [c for c in result.components if c.status == "fail"]
    if name in NAMED_NOW:  # a catalogued mistake reproduces it: named, at the planted line
        assert [(f.name, f.line) for f in comp.findings] == [(NAMED_NOW[name], number)], report
        return
    assert not comp.named(), report
    (note,) = [f.observed for f in comp.findings if f.name == DEPARTS]
    assert f"{step} {number}: {line}" in note["en"] and form in note["en"], report
    quoted = [ln.strip() for ln in planted.splitlines() if len(ln.strip()) > 12 and ln.strip() in note["en"]]
    assert line in quoted and len(quoted) <= 2


# Attention whose heads are merged without moving them next to the head dimension first raises
# further on (at W_o): the note quotes the line that made the shape, with its form.
D2L_ATTENTION = '''import math

import torch
from torch import nn


def transpose_qkv(X, num_heads):
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)
    X = X.permute(0, 2, 1, 3)
    return X.reshape(-1, X.shape[2], X.shape[3])


def transpose_output(X, num_heads):
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])
    X = X.permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)


class MultiHeadAttention(nn.Module):
    def __init__(self, num_hiddens, num_heads, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.W_q = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_v = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def forward(self, queries, keys, values):
        q = transpose_qkv(self.W_q(queries), self.num_heads)
        k = transpose_qkv(self.W_k(keys), self.num_heads)
        v = transpose_qkv(self.W_v(values), self.num_heads)
        weights = torch.softmax(torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1]), dim=-1)
        return self.W_o(transpose_output(torch.bmm(weights, v), self.num_heads))
'''


def test_attention_that_raises_is_localized_at_the_reshape_without_its_permute(tmp_path):
    path = tmp_path / "attention.py"
    path.write_text(D2L_ATTENTION)
    (comp,) = check_file(str(path)).components
    assert comp.status == "pass", comp
    source = D2L_ATTENTION.replace("    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])\n    X = X.permute(0, 2, 1, 3)\n",
                                   "    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])\n")
    path.write_text(source)
    (comp,) = check_file(str(path)).components
    assert comp.status == "fail" and comp.error.kind == "exception", comp
    (note,) = [f.observed for f in comp.findings if f.name == DEPARTS]
    assert "`return` at line 15: return X.reshape(X.shape[0], X.shape[1], -1)" in note["en"], note
    assert "a transpose or permute left out" in note["en"] and "第 15 行" in note["zh"], note


def test_a_term_fits_only_where_every_entry_fits_and_the_first_that_fits_is_named():
    """The terms are tested at once: one that fits all but one entry is passed over, the next that
    fits everywhere is named (added, left out, or scaled)."""
    import torch

    from handformer.check.core.localize import _term

    g = torch.Generator().manual_seed(0)
    r, term = (torch.randn(2, 3, 4, generator=g, dtype=torch.float64) for _ in range(2))
    near = term.clone()
    near[0, 0, 0] += 1.0  # fits everywhere but one entry
    terms = [("near", near), ("x", term)]
    assert _term(r + term, r, "y", terms, {})["en"] == "y plus an extra term equal to x"
    assert _term(r - term, r, "y", terms, {})["en"] == "y missing the term x"
    assert _term(r + 0.5 * term, r, "y", terms, {"d_k": 4.0})["en"].endswith("scaled by 1.5")
    assert _term(r + 0.25 * term, r, "y", terms, {"d_k": 4.0})["en"].endswith("scaled by 1.25")
