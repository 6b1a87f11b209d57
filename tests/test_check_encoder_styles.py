"""Encoders in fairseq's and DistilBERT's styles (small files written in their style here, none copied,
each checked against torch's nn.TransformerEncoderLayer or transformers' DistilBERT block with the same
weights when written): fairseq's layer reads its stream sequence-first (T, B, C) and requires its
(B, T) True = pad mask, its sizes named attention_heads and ffn_embed_dim, and its encoder returns a
dict of states, no logits (checked as the stack of its layers; a forgotten `return` FAILs); DistilBERT's
block takes attn_mask=None but reads it unguarded. Each correct part passes; a planted mistake fails
quoting its line."""

from __future__ import annotations

import pytest

from handformer.check.core.discovery import size_of
from handformer.check.core.engine import check_file

pytestmark = pytest.mark.usefixtures("one_thread")

FAIRSEQ = '''import math

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, embed_dim, attention_heads):
        super().__init__()
        self.heads, self.head_dim = attention_heads, embed_dim // attention_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, key_padding_mask):
        T, B, C = x.shape  # sequence first; key_padding_mask (B, T), True = pad
        q = self.q_proj(x).view(T, B * self.heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(T, B * self.heads, self.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(T, B * self.heads, self.head_dim).transpose(0, 1)
        w = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.head_dim)  # (B*H, T, T)
        w = w.view(B, self.heads, T, T).masked_fill(key_padding_mask.unsqueeze(1).unsqueeze(2), float("-inf"))
        w = F.softmax(w.view(B * self.heads, T, T), dim=-1)
        return self.out_proj(torch.bmm(w, v).transpose(0, 1).reshape(T, B, C))


class EncoderLayer(nn.Module):
    def __init__(self, embed_dim, attention_heads, ffn_embed_dim, dropout=0.1):
        super().__init__()
        self.self_attn = SelfAttention(embed_dim, attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_embed_dim)
        self.fc2 = nn.Linear(ffn_embed_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)
        self.dropout = dropout

    def forward(self, x, encoder_padding_mask):
        residual = x
        x = F.dropout(self.self_attn(x, encoder_padding_mask), p=self.dropout, training=self.training)
        x = self.self_attn_layer_norm(residual + x)
        residual = x
        x = self.fc2(F.relu(self.fc1(x)))
        x = F.dropout(x, p=self.dropout, training=self.training)
        return self.final_layer_norm(residual + x)


class Encoder(nn.Module):
    def __init__(self, vocab_size, embed_dim, attention_heads, ffn_embed_dim, layers=2, padding_idx=1):
        super().__init__()
        self.padding_idx = padding_idx
        self.embed_tokens = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        self.layers = nn.ModuleList(
            [EncoderLayer(embed_dim, attention_heads, ffn_embed_dim) for _ in range(layers)])

    def forward(self, src_tokens):
        x = self.embed_tokens(src_tokens).transpose(0, 1)  # (T, B, C)
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        for layer in self.layers:
            x = layer(x, encoder_padding_mask)
        return {"encoder_out": x, "encoder_padding_mask": encoder_padding_mask}
'''

DISTILBERT = '''import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Config:
    dim: int = 768
    n_heads: int = 12
    hidden_dim: int = 3072


class SelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_heads = config.n_heads
        self.q_lin = nn.Linear(config.dim, config.dim)
        self.k_lin = nn.Linear(config.dim, config.dim)
        self.v_lin = nn.Linear(config.dim, config.dim)
        self.out_lin = nn.Linear(config.dim, config.dim)

    def forward(self, query, key, value, mask):
        bs, q_length, dim = query.size()
        dh = dim // self.n_heads

        def shape(x):
            return x.view(bs, -1, self.n_heads, dh).transpose(1, 2)  # (bs, n_heads, len, dh)

        q = shape(self.q_lin(query)) / math.sqrt(dh)
        scores = q @ shape(self.k_lin(key)).transpose(2, 3)  # (bs, n_heads, q_length, k_length)
        hidden = (mask == 0).view(bs, 1, 1, key.size(1)).expand_as(scores)  # mask (bs, k_length), 1 = token
        weights = scores.masked_fill(hidden, torch.finfo(scores.dtype).min).softmax(dim=-1)
        context = (weights @ shape(self.v_lin(value))).transpose(1, 2).reshape(bs, q_length, dim)
        return (self.out_lin(context),)


class TransformerBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = SelfAttention(config)
        self.sa_layer_norm = nn.LayerNorm(config.dim, eps=1e-12)
        self.lin1 = nn.Linear(config.dim, config.hidden_dim)
        self.lin2 = nn.Linear(config.hidden_dim, config.dim)
        self.output_layer_norm = nn.LayerNorm(config.dim, eps=1e-12)

    def forward(self, x, attn_mask=None):
        sa_output = self.attention(x, x, x, attn_mask)[0]
        sa_output = self.sa_layer_norm(sa_output + x)
        ffn_output = self.lin2(nn.functional.gelu(self.lin1(sa_output)))
        return (self.output_layer_norm(ffn_output + sa_output),)
'''


def _components(tmp_path, name, source, kinds):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return {c.kind: c for c in check_file(str(path), only=kinds).components}


def _quoted(component):
    return [f"line {f.line}: {f.code}" for f in component.findings]


def test_a_fairseq_encoder_layer_sequence_first_with_its_padding_mask_required_passes(tmp_path):
    found = _components(tmp_path, "fairseq", FAIRSEQ, ["mha", "encoder_layer", "gpt"])
    assert found["mha"].status == "pass" and found["encoder_layer"].status == "pass", found
    assert found["gpt"].status == "pass", found["gpt"]  # checked as the stack of its layers
    assert "returns hidden states" in found["gpt"].notes[0]["en"]


def test_a_planted_mistake_in_a_fairseq_encoder_layer_fails_quoting_its_line(tmp_path):
    right = "x = self.self_attn_layer_norm(residual + x)"
    source = FAIRSEQ.replace(right, "x = self.self_attn_layer_norm(x)")
    (layer,) = _components(tmp_path, "fairseq_planted", source, ["encoder_layer"]).values()
    assert layer.status == "fail"
    assert "line 41: x = self.self_attn_layer_norm(x)" in _quoted(layer), _quoted(layer)


@pytest.mark.parametrize(("returned", "status", "said"), [
    ('{"encoder_padding_mask": encoder_padding_mask}', "not_checked", "no logits (B, T, vocab_size)"),
    ("None", "fail", None)])
def test_an_encoder_returning_no_logits_is_not_checked_and_a_forgotten_return_fails(tmp_path, returned,
                                                                                     status, said):
    right = 'return {"encoder_out": x, "encoder_padding_mask": encoder_padding_mask}'
    assert right in FAIRSEQ
    (gpt,) = _components(tmp_path, "encoder", FAIRSEQ.replace(right, f"return {returned}"), ["gpt"]).values()
    assert gpt.status == status, (gpt.status, gpt.error)
    assert said is None or said in gpt.error.message


def test_a_distilbert_block_reading_its_optional_mask_unguarded_passes_and_a_plant_fails(tmp_path):
    (block,) = _components(tmp_path, "distilbert", DISTILBERT, ["encoder_layer"]).values()
    assert block.status == "pass", (block.error, [k for k in block.checks if not k.ok])
    right = "sa_output = self.sa_layer_norm(sa_output + x)"
    planted = DISTILBERT.replace(right, "sa_output = self.sa_layer_norm(sa_output)")
    (block,) = _components(tmp_path, "distilbert_planted", planted, ["encoder_layer"]).values()
    assert block.status == "fail"
    assert "line 50: sa_output = self.sa_layer_norm(sa_output)" in _quoted(block), _quoted(block)


@pytest.mark.parametrize("name, size", [
    ("attention_heads", "n_heads"), ("decoder_attention_heads", "n_heads"), ("key_value_heads", "n_kv_heads"),
    ("kv_heads", "n_kv_heads"), ("ffn_embed_dim", "d_ff"), ("mlp_hidden_size", "d_ff"), ("filter_size", "d_ff"), ("filter_value", None), ("heads_dim", None),
    ("head_dim", "d_head"), ("n_layers", "n_layers"), ("layer_norm_eps", "eps"), ("activation", None)])
def test_a_size_name_no_table_lists_is_read_by_its_words(name, size):
    assert size_of(name) == size
