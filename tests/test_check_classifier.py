"""check on an encoder-only classifier (BERT's shape), and an attention whose mask is added (BERT's
`(1 - mask) * -10000`): the model checked against one built from the learner's own weights and layers;
the mistakes no part shows (positions from 1, the pooler on the last position) FAIL at their line."""

import pytest

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

CLASSIFIER = '''
import math

import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.h, self.d_k = n_heads, d_model // n_heads
        self.qkv = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(3)])
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, S, _ = x.shape
        q, k, v = [f(x).view(B, S, self.h, self.d_k).transpose(1, 2) for f in self.qkv]  # (B, H, S, Dh)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores + (1.0 - mask.float()) * -10000.0
        ctx = scores.softmax(-1) @ v  # (B, H, S, Dh)
        return self.out(ctx.transpose(1, 2).reshape(B, S, -1))


class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.attn, self.norm1 = MultiHeadAttention(d_model, n_heads), nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        x = self.norm1(x + self.attn(x, mask))
        return self.norm2(x + self.ffn(x))


class TextClassifier(nn.Module):
    def __init__(self, vocab_size, num_classes, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=64):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model, padding_idx=0)
        self.pos_emb = nn.Embedding(max_len + 1, d_model)
        self.cls_token = nn.Parameter(torch.randn(d_model) * 0.02)
        self.norm = nn.LayerNorm(d_model)
        self.blocks = nn.ModuleList([EncoderLayer(d_model, n_heads, d_ff) for _ in range(n_layers)])
        self.pool = nn.Linear(d_model, d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, ids):
        B, S = ids.shape
        x = torch.cat([self.cls_token.expand(B, 1, -1), self.tok_emb(ids)], dim=1)  # (B, S + 1, D)
        positions = torch.arange(0, S + 1)
        x = self.norm(x + self.pos_emb(positions))
        keep = torch.cat([torch.ones(B, 1, dtype=torch.bool), ids != 0], 1)[:, None, None, :]  # (B, 1, 1, S + 1)
        for block in self.blocks:
            x = block(x, keep)
        return self.head(torch.tanh(self.pool(x[:, 0])))
'''
PLANTS = {  # (the edit, the kind that fails, the line quoted)
    "positions_from_one": (("torch.arange(0, S + 1)", "torch.arange(1, S + 2)"), "classifier",
                           "positions = torch.arange(1, S + 2)"),
    "pool_last": (("self.pool(x[:, 0])", "self.pool(x[:, -1])"), "classifier",
                  "return self.head(torch.tanh(self.pool(x[:, -1])))"),
    "additive_mask_inverted": (("(1.0 - mask.float()) * -10000.0", "mask.float() * -10000.0"), "mha",
                               "scores = scores + mask.float() * -10000.0"),
}


def test_the_classifier_passes_checked_against_its_own_weights(tmp_path):
    path = tmp_path / "classifier.py"
    path.write_text(CLASSIFIER)
    result = check_file(str(path), only=["classifier", "mha"])
    assert [(c.name, c.status) for c in result.components] == [
        ("MultiHeadAttention", "pass"), ("TextClassifier", "pass")], format_report(result)
    assert result.components[1].mapping[:3] == ["tok_emb -> tokens", "pos_emb -> positions", "cls_token -> cls"]


@pytest.mark.parametrize("name", list(PLANTS))
def test_what_no_part_shows_fails_at_its_line(tmp_path, name):
    (old, new), kind, line = PLANTS[name]
    path = tmp_path / f"{name}.py"
    path.write_text(CLASSIFIER.replace(old, new))
    result = check_file(str(path), only=[kind])
    (comp,) = result.components
    assert comp.status == "fail" and line in format_report(result), format_report(result)


def test_a_classifier_whose_cls_is_a_token_of_the_input_passes(tmp_path):
    """BERT's own: [CLS] is the input's first token (no vector put in front), positions 0..S - 1."""
    path = tmp_path / "token_cls.py"
    path.write_text(CLASSIFIER.replace("        self.cls_token = nn.Parameter(torch.randn(d_model) * 0.02)\n", "")
                    .replace("torch.cat([self.cls_token.expand(B, 1, -1), self.tok_emb(ids)], dim=1)", "self.tok_emb(ids)")
                    .replace("torch.arange(0, S + 1)", "torch.arange(S)")
                    .replace("torch.cat([torch.ones(B, 1, dtype=torch.bool), ids != 0], 1)", "(ids != 0)"))
    (comp,) = check_file(str(path), only=["classifier"]).components
    assert comp.status == "pass", comp
