"""`check` localizes what its catalogue has no name for: mistakes planted into a correct learner
attention that no catalogued mistake reproduces FAIL with a note naming the first departing step,
quoting the planted line, and the form of the difference; the correct file still passes."""

from __future__ import annotations

import pytest

from handformer.check.report import format_report
from handformer.check.runners import check_file

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
    assert comp.status == "fail" and not comp.findings, report
    (note,) = [n for n in comp.notes if "parts from the reference" in n["en"]]
    assert f"{step} at line {number}: {planted}" in note["en"], report
    assert form in note["en"], report
    assert f"第 {number} 行" in note["zh"] and planted in zh
    quoted = [ln.strip() for ln in source.splitlines() if len(ln.strip()) > 20 and ln.strip() in note["en"]]
    assert quoted == [planted]  # one line quoted: a diagnosis, not a listing
