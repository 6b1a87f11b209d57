"""`check` builds and drives the styles of the classic public tutorials (small files written in
their style here, none copied): jadore801120's ScaledDotProductAttention(temperature) and its FFN
with the residual and norm inside (compared as that sublayer), hyunwoongko's PositionalEncoding
whose forward(ids) returns the table, gpt-fast's Attention(config) and block handed a real rotary
table (T, Dh/2, 2), its ffn_norm defined before attention_norm, its precompute_freqs_cis(seq_len,
n_elem, dtype=torch.bfloat16) asked for float64; bentrevett's Seq2Seq(encoder, decoder, ...) built
from the file's Encoder(input_dim, ...) and Decoder(output_dim, ...); nanochat's attention handed
cos_sin, (cos, sin) each (1, T, 1, Dh/2), rotating its halves the other way, and its ReLU² MLP; Umar Jamil's forward(x, start_pos,
freqs_complex); Raschka's GroupedQueryAttention(..., qk_norm=False), built with its QK-norm
on, the norm after RoPE named; the Chinese courses' ModelArgs with required fields, forward(q, k, v),
a decoder layer forward(x, enc_out) and an FFN as wide as the model; a model with encode, decode and
project built by a factory; a bigram model; a generate that yields tokens. Each correct file passes;
a planted mistake fails."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from handformer.check.core.engine import check_file
from handformer.check.core.result import DEPARTS

pytestmark = pytest.mark.usefixtures("one_thread")

JADORE = '''import torch
import torch.nn.functional as F
from torch import nn


class ScaledDotProductAttention(nn.Module):
    def __init__(self, temperature, attn_dropout=0.1):
        super().__init__()
        self.temperature = temperature
        self.dropout = nn.Dropout(attn_dropout)

    def forward(self, q, k, v, mask=None):
        attn = torch.matmul(q / self.temperature, k.transpose(2, 3))
        if mask is not None:
            attn = attn.masked_fill(mask == 0, -1e9)
        attn = self.dropout(F.softmax(attn, dim=-1))
        return torch.matmul(attn, v), attn


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_in, d_hid, dropout=0.1):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_in, d_hid), nn.Linear(d_hid, d_in)
        self.layer_norm = nn.LayerNorm(d_in, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.layer_norm(self.dropout(self.w_2(F.relu(self.w_1(x)))) + x)
'''

HYUNWOONGKO = '''import torch
from torch import nn


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len, device):
        super().__init__()
        self.encoding = torch.zeros(max_len, d_model, device=device)
        pos = torch.arange(0, max_len, device=device).float().unsqueeze(dim=1)
        _2i = torch.arange(0, d_model, step=2, device=device).float()
        self.encoding[:, 0::2] = torch.sin(pos / (10000 ** (_2i / d_model)))
        self.encoding[:, 1::2] = torch.cos(pos / (10000 ** (_2i / d_model)))

    def forward(self, x):
        batch_size, seq_len = x.size()
        return self.encoding[:seq_len, :]
'''

GPT_FAST = '''from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelArgs:
    dim: int = 64
    n_head: int = 4
    norm_eps: float = 1e-5

    @property
    def head_dim(self):
        return self.dim // self.n_head


def precompute_freqs_cis(seq_len, n_elem, base=10000, dtype=torch.bfloat16):
    freqs = 1.0 / (base ** (torch.arange(0, n_elem, 2)[: (n_elem // 2)].float() / n_elem))
    freqs = torch.outer(torch.arange(seq_len), freqs)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    return torch.stack([freqs_cis.real, freqs_cis.imag], dim=-1).to(dtype=dtype)


def apply_rotary_emb(x, freqs_cis):
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    f = freqs_cis.view(1, xs.size(1), 1, xs.size(3), 2)
    out = torch.stack([xs[..., 0] * f[..., 0] - xs[..., 1] * f[..., 1],
                       xs[..., 1] * f[..., 0] + xs[..., 0] * f[..., 1]], -1)
    return out.flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wqkv = nn.Linear(config.dim, 3 * config.dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)
        self.n_head, self.head_dim, self.dim = config.n_head, config.head_dim, config.dim

    def forward(self, x, freqs_cis, mask, input_pos=None):
        B, T, _ = x.shape
        q, k, v = self.wqkv(x).split([self.dim, self.dim, self.dim], dim=-1)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim) for t in (q, k, v))
        q, k = apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).contiguous().view(B, T, self.dim))


class FeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w1 = nn.Linear(config.dim, 4 * config.dim, bias=False)
        self.w2 = nn.Linear(4 * config.dim, config.dim, bias=False)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = Attention(config)
        self.feed_forward = FeedForward(config)
        self.ffn_norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.attention_norm = nn.LayerNorm(config.dim, eps=config.norm_eps)

    def forward(self, x, input_pos, freqs_cis, mask):
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))
'''

BENTREVETT = '''import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, input_dim, hid_dim, n_layers, n_heads, pf_dim, dropout, device, max_length=100):
        super().__init__()
        self.tok_embedding, self.pos_embedding = nn.Embedding(input_dim, hid_dim), nn.Embedding(max_length, hid_dim)
        self.fc = nn.Linear(hid_dim, hid_dim)

    def forward(self, src, src_mask):
        return self.fc(self.tok_embedding(src) + self.pos_embedding(torch.arange(src.size(1))))


class Decoder(nn.Module):
    def __init__(self, output_dim, hid_dim, n_layers, n_heads, pf_dim, dropout, device, max_length=100):
        super().__init__()
        self.tok_embedding, self.pos_embedding = nn.Embedding(output_dim, hid_dim), nn.Embedding(max_length, hid_dim)
        self.fc_out = nn.Linear(hid_dim, output_dim)

    def forward(self, trg, enc_src, trg_mask, src_mask):
        keep = src_mask.float()[..., None]  # the mean of the real source positions
        keep = keep.to(enc_src.dtype)
        memory = (enc_src * keep).sum(1, keepdim=True) / keep.sum(1, keepdim=True)
        weights = trg_mask.to(enc_src.dtype) / trg_mask.sum(-1, keepdim=True)  # the mean of the prefix
        x = weights @ (self.tok_embedding(trg) + self.pos_embedding(torch.arange(trg.size(1))))
        return self.fc_out(x + memory)


class Seq2Seq(nn.Module):
    def __init__(self, encoder, decoder, src_pad_idx, trg_pad_idx, device):
        super().__init__()
        self.encoder, self.decoder, self.src_pad_idx = encoder, decoder, src_pad_idx

    def forward(self, src, trg):
        src_mask = src != self.src_pad_idx
        trg_mask = torch.tril(torch.ones(trg.size(1), trg.size(1))).bool()
        return self.decoder(trg, self.encoder(src, src_mask), trg_mask, src_mask)
'''

NANOCHAT = '''import torch
import torch.nn.functional as F
from torch import nn


def apply_rotary_emb(x, cos, sin):  # x (B, T, H, D); cos, sin (1, T, 1, D/2)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos + b * sin, b * cos - a * sin], dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.n_embd // config.n_head
        self.c_q = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_k = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_v = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, cos_sin):
        B, T, C = x.size()
        shape = (B, T, self.n_head, self.head_dim)
        q, k, v = self.c_q(x).view(shape), self.c_k(x).view(shape), self.c_v(x).view(shape)
        cos, sin = cos_sin
        q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())
'''

UMAR = '''import math

import torch
import torch.nn.functional as F
from torch import nn


def apply_rotary_embeddings(x, freqs_complex):  # x (B, T, H, Dh); freqs_complex (T, Dh/2)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs_complex[None, :, None]).reshape(x.shape).type_as(x)


class SelfAttention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_heads, self.head_dim = args.n_heads, args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x, start_pos, freqs_complex):
        B, T, _ = x.shape
        shape = (B, T, self.n_heads, self.head_dim)
        q = apply_rotary_embeddings(self.wq(x).view(shape), freqs_complex).transpose(1, 2)
        k = apply_rotary_embeddings(self.wk(x).view(shape), freqs_complex).transpose(1, 2)
        v = self.wv(x).view(shape).transpose(1, 2)
        scores = F.softmax(q @ k.transpose(2, 3) / math.sqrt(self.head_dim), dim=-1)
        return self.wo((scores @ v).transpose(1, 2).reshape(B, T, -1))
'''

RASCHKA_QK = '''import torch
from torch import nn


def apply_rope(x, cos, sin):  # x (B, H, T, Dh); cos, sin (T, Dh)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[: x.shape[2]] + rotated * sin[: x.shape[2]]


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_in, num_heads, num_kv_groups, head_dim=None, qk_norm=False):
        super().__init__()
        self.num_heads, self.num_kv_groups = num_heads, num_kv_groups
        self.head_dim = head_dim or d_in // num_heads
        self.W_query = nn.Linear(d_in, num_heads * self.head_dim, bias=False)
        self.W_key = nn.Linear(d_in, num_kv_groups * self.head_dim, bias=False)
        self.W_value = nn.Linear(d_in, num_kv_groups * self.head_dim, bias=False)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_in, bias=False)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6) if qk_norm else None

    def forward(self, x, mask, cos, sin):
        b, t, _ = x.shape
        q = self.W_query(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.W_key(x).view(b, t, self.num_kv_groups, self.head_dim).transpose(1, 2)
        v = self.W_value(x).view(b, t, self.num_kv_groups, self.head_dim).transpose(1, 2)
        if self.q_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = self.num_heads // self.num_kv_groups
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(2, 3)).masked_fill(mask, -torch.inf)
        weights = torch.softmax(scores / self.head_dim**0.5, dim=-1)
        return self.out_proj((weights @ v).transpose(1, 2).reshape(b, t, -1))
'''
# PyTorch's nn.Transformer tutorial's language model, batch-first: nn.TransformerEncoder, a sine table,
# the embeddings times sqrt(d_model), a float -inf mask
TORCH_TUTORIAL_LM = '''import math

import torch
from torch import nn


class SineTable(nn.Module):
    def __init__(self, width, max_len=512):
        super().__init__()
        pos = torch.arange(max_len, dtype=torch.float).unsqueeze(1)
        two_i = torch.arange(0, width, 2, dtype=torch.float)
        table = torch.zeros(1, max_len, width)
        table[0, :, 0::2] = torch.sin(pos / 10000 ** (two_i / width))
        table[0, :, 1::2] = torch.cos(pos / 10000 ** (two_i / width))
        self.register_buffer("table", table)

    def forward(self, x):
        return x + self.table[:, : x.size(1)]


class WordLM(nn.Module):
    def __init__(self, vocab_size, d_model, n_heads, d_ff, n_layers):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = SineTable(d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.1, batch_first=True)
        self.stack = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.lm_head = nn.Linear(d_model, vocab_size)
        self.scale = math.sqrt(d_model)

    def forward(self, ids):
        t = ids.size(1)
        future = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        h = self.pos(self.tok(ids) * self.scale)
        return self.lm_head(self.stack(h, mask=future))
'''

QK_BEFORE = """        if self.q_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
"""
QK_AFTER = """        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.q_norm:
            q, k = self.q_norm(q), self.k_norm(k)
"""

# (file, the kinds checked, the correct line, the planted line[, the line the report quotes])
CASES = {
    "jadore_temperature": (JADORE, ["sdpa"], "q / self.temperature", "q * self.temperature"),
    "hyunwoongko_table": (HYUNWOONGKO, ["positional_encoding"], "encoding[:, 1::2] = torch.cos",
                          "encoding[:, 1::2] = torch.sin"),
    # pe_wrong_frequency's patterns match the sin line too: the finding quotes the line that departs
    "hyunwoongko_cos_exponent": (HYUNWOONGKO, ["positional_encoding"], "torch.cos(pos / (10000 ** (_2i / d_model)))",
                                 "torch.cos(pos / (10000 ** ((_2i + 1) / d_model)))",
                                 "line 12: self.encoding[:, 1::2] = torch.cos(pos / (10000 ** ((_2i + 1) / d_model)))"),
    "gpt_fast_attention": (GPT_FAST, ["mha"], "xs[..., 1] * f[..., 0] + xs", "xs[..., 1] * f[..., 0] - xs"),
    "gpt_fast_table": (GPT_FAST, ["rope"], "[freqs_cis.real, freqs_cis.imag]", "[freqs_cis.imag, freqs_cis.real]"),
    "gpt_fast_block": (GPT_FAST, ["block"], "h + self.feed_forward(self.ffn_norm(h))",
                       "h + self.feed_forward(self.attention_norm(h))"),
    "bentrevett_stacks": (BENTREVETT, ["transformer"], "torch.tril(torch.ones(trg.size(1), trg.size(1)))",
                          "torch.ones(trg.size(1), trg.size(1))"),
    "nanochat_attention": (NANOCHAT, ["causal_attention"], "a * cos + b * sin", "a * cos - b * sin"),
    "nanochat_rope": (NANOCHAT, ["rope"], "a * cos + b * sin", "a * cos - b * sin"),
    "nanochat_relu2": (NANOCHAT, ["ffn"], "F.relu(self.c_fc(x)).square()", "self.c_fc(x).square()"),
    "umar_freqs_complex": (UMAR, ["mha"], "pairs * freqs_complex[", "pairs * freqs_complex.conj()["),
    "raschka_qk_norm_switch": (RASCHKA_QK, ["gqa"], QK_BEFORE, QK_AFTER),
    "torch_tutorial_scale_unused": (TORCH_TUTORIAL_LM, ["gpt"], "self.tok(ids) * self.scale", "self.tok(ids)",
                                    "line 34: h = self.pos(self.tok(ids))"),
    "torch_tutorial_no_mask": (TORCH_TUTORIAL_LM, ["gpt"], "self.stack(h, mask=future)", "self.stack(h)",
                               "line 35: return self.lm_head(self.stack(h))"),
}


def _statuses(tmp_path, name, source, kinds):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return {c.name: c for c in check_file(str(path), only=kinds).components}


@pytest.mark.parametrize("case", CASES)
def test_the_tutorial_style_is_driven_and_a_planted_mistake_fails(tmp_path, case):
    source, kinds, right, wrong, *quoted = CASES[case]
    assert right in source
    correct = _statuses(tmp_path, "correct", source, kinds)
    assert correct and all(c.status == "pass" for c in correct.values()), {
        n: (c.status, c.error) for n, c in correct.items()}
    planted = _statuses(tmp_path, "planted", source.replace(right, wrong, 1), kinds)
    assert planted and any(c.status == "fail" for c in planted.values()), {
        n: (c.status, c.error) for n, c in planted.items()}
    said = [f"line {f.line}: {f.code}" for c in planted.values() for f in c.findings]
    assert all(line in said for line in quoted), said


def test_an_ffn_with_its_residual_and_norm_inside_is_compared_as_that_sublayer(tmp_path):
    (ffn,) = _statuses(tmp_path, "jadore", JADORE, ["ffn"]).values()
    assert ffn.status == "pass", ffn.error
    assert any("norm(x + f(x)) (post-norm)" in n["en"] and "残差和归一化" in n["zh"] for n in ffn.notes)


def test_a_qk_norm_without_gains_is_handformers_with_gains_of_one(tmp_path):
    """nanochat's QK-norm, F.rms_norm without gains after RoPE, is handformer's QK-norm with gains of
    one (a rotation keeps each head's RMS, so the order does not matter): compared, and it passes."""
    qk = "        q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))\n"
    normed = NANOCHAT.replace("        y = F.scaled", qk + "        y = F.scaled", 1)
    (attention,) = _statuses(tmp_path, "normed", normed, ["causal_attention"]).values()
    assert attention.status == "pass" and "rms_norm(q) (no gain) -> q_norm" in attention.mapping



# --- learners' files in more styles: each correct one passes with every component checked, and a
# planted mistake fails

NANOCHAT_GPT = '''from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    sequence_len: int = 256
    vocab_size: int = 100
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64


def rms(x):  # no gain, as nanochat
    return F.rms_norm(x, (x.size(-1),))


def rotate(x, cos, sin):  # x (B, T, H, Dh); cos, sin (1, T, 1, Dh/2)
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos + b * sin, b * cos - a * sin], dim=-1)


class Attn(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.h, self.d = config.n_head, config.n_embd // config.n_head
        self.q = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.k = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.v = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.o = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, cos_sin):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.h, self.d) for p in (self.q, self.k, self.v))
        q, k = rotate(q, *cos_sin), rotate(k, *cos_sin)
        q, k = rms(q), rms(k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, C))


class Mlp(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.up = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.down = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.down(F.relu(self.up(x)).square())


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn, self.mlp = Attn(config, layer_idx), Mlp(config)

    def forward(self, x, cos_sin):
        x = x + self.attn(rms(x), cos_sin)
        return x + self.mlp(rms(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.h = nn.ModuleList([Block(config, i) for i in range(config.n_layer)])
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        d = config.n_embd // config.n_head
        angles = torch.outer(torch.arange(config.sequence_len * 2).float(),
                             10000.0 ** (-torch.arange(0, d, 2).float() / d))
        self.register_buffer("cos", angles.cos()[None, :, None], persistent=False)
        self.register_buffer("sin", angles.sin()[None, :, None], persistent=False)

    def forward(self, idx, targets=None):
        T = idx.size(1)
        x = rms(self.wte(idx))
        for block in self.h:
            x = block(x, (self.cos[:, :T], self.sin[:, :T]))
        logits = self.lm_head(rms(x))
        if targets is not None:
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits
'''

# nanochat's newer GPT: value embeddings (a token table a layer adds to its values, None in the
# others), learned per-layer residual scalars, soft-capped logits
NANOCHAT_SCALARS = (
    NANOCHAT_GPT
    .replace("    def forward(self, x, cos_sin):\n        B, T, C = x.shape\n        q, k, v = (p(x).view(B, T, self.h, self.d) for p in (self.q, self.k, self.v))\n",
             "    def forward(self, x, cos_sin, extra_v):\n        B, T, C = x.shape\n        q, k, v = (p(x).view(B, T, self.h, self.d) for p in (self.q, self.k, self.v))\n"
             "        if extra_v is not None:\n            v = v + extra_v.view(B, T, self.h, self.d)\n")
    .replace("    def forward(self, x, cos_sin):\n        x = x + self.attn(rms(x), cos_sin)",
             "    def forward(self, x, cos_sin, extra_v):\n        x = x + self.attn(rms(x), cos_sin, extra_v)")
    .replace("        d = config.n_embd // config.n_head\n",
             "        d = config.n_embd // config.n_head\n"
             "        self.skip_scale = nn.Parameter(torch.ones(config.n_layer))\n"
             "        self.embed_mix = nn.Parameter(torch.zeros(config.n_layer))\n"
             "        self.v_tables = nn.ModuleList([nn.Embedding(config.vocab_size, config.n_embd)])\n")
    .replace("        x = rms(self.wte(idx))\n        for block in self.h:\n            x = block(x, (self.cos[:, :T], self.sin[:, :T]))\n        logits = self.lm_head(rms(x))\n",
             "        x = first = rms(self.wte(idx))\n        for i, block in enumerate(self.h):\n"
             "            x = self.skip_scale[i] * x + self.embed_mix[i] * first\n"
             "            extra = self.v_tables[0](idx) if i == len(self.h) - 1 else None\n"
             "            x = block(x, (self.cos[:, :T], self.sin[:, :T]), extra)\n"
             "        logits = torch.tanh(self.lm_head(rms(x)) / 30.0) * 30.0\n"))


UMAR_MODEL = UMAR + '''

class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class CachedAttention(nn.Module):  # one token at a time, its keys and values kept
    def __init__(self, args):
        super().__init__()
        self.h, self.d = args.n_heads, args.dim // args.n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(args.dim, args.dim, bias=False) for _ in range(4))
        self.cache_k = torch.zeros(args.max_batch_size, args.max_seq_len, self.h, self.d)
        self.cache_v = torch.zeros(args.max_batch_size, args.max_seq_len, self.h, self.d)

    def forward(self, x, start_pos, freqs_complex):
        B, T, _ = x.shape
        q = apply_rotary_embeddings(self.wq(x).view(B, T, self.h, self.d), freqs_complex)
        k = apply_rotary_embeddings(self.wk(x).view(B, T, self.h, self.d), freqs_complex)
        self.cache_k, self.cache_v = self.cache_k.to(k), self.cache_v.to(k)
        self.cache_k[:B, start_pos:start_pos + T] = k
        self.cache_v[:B, start_pos:start_pos + T] = self.wv(x).view(B, T, self.h, self.d)
        keys = self.cache_k[:B, :start_pos + T].transpose(1, 2)
        values = self.cache_v[:B, :start_pos + T].transpose(1, 2)
        scores = F.softmax(q.transpose(1, 2) @ keys.transpose(2, 3) / math.sqrt(self.d), dim=-1)
        return self.wo((scores @ values).transpose(1, 2).reshape(B, T, -1))


class EncoderBlock(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.attention = CachedAttention(args)
        self.w1 = nn.Linear(args.dim, 4 * args.dim, bias=False)
        self.w2 = nn.Linear(4 * args.dim, args.dim, bias=False)
        self.attention_norm, self.ffn_norm = RMSNorm(args.dim), RMSNorm(args.dim)

    def forward(self, x, start_pos, freqs_complex):
        h = x + self.attention(self.attention_norm(x), start_pos, freqs_complex)
        return h + self.w2(F.relu(self.w1(self.ffn_norm(h))))
'''

ENCODER_BLOCK = '''import math

import torch
import torch.nn.functional as F
from torch import nn


class TransformerBlock(nn.Module):  # the paper's encoder block: post-norm
    def __init__(self, d_model, num_heads, d_ff):
        super().__init__()
        self.h = num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))
        self.up, self.down = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x, mask=None):
        b, t, c = x.shape
        q, k, v = (p(x).view(b, t, self.h, -1) for p in (self.q, self.k, self.v))
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(c // self.h)
        if mask is not None:
            s = s.masked_fill(mask == 0, float("-inf"))
        a = torch.einsum("bhqk,bkhd->bqhd", F.softmax(s, dim=-1), v).reshape(b, t, c)
        x = self.ln1(x + self.o(a))
        return self.ln2(x + self.down(F.relu(self.up(x))))
'''

FREE_SAMPLER = '''import torch
import torch.nn.functional as F


@torch.no_grad()
def sample_sequence(model, context, length, temperature=1.0):
    out = context
    for _ in range(length):
        logits = model(out)[:, -1, :] / temperature
        out = torch.cat((out, torch.multinomial(F.softmax(logits, dim=-1), 1)), dim=1)
    return out
'''

LLAMA2C_FFN = '''from dataclasses import dataclass
from typing import Optional

import torch.nn.functional as F
from torch import nn


@dataclass
class ModelArgs:
    dim: int = 288
    n_heads: int = 6
    hidden_dim: Optional[int] = None  # the FFN's width; None: 8 * dim / 3
    multiple_of: int = 32


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        hidden = args.hidden_dim or int(8 * args.dim / 3)
        self.w1 = nn.Linear(args.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
'''

# (file, the kinds checked, the correct line, the planted line: None where the runner's planted
# mistakes are tested elsewhere and the run is dear)
MORE_CASES = {
    "nanochat_gpt": (NANOCHAT_GPT, ["gpt"], "return x + self.mlp(rms(x))", None),
    "umar_one_token_block": (UMAR_MODEL, ["block"], "return h + self.w2(F.relu(", None),
    "free_sampler_no_block_size": (FREE_SAMPLER, ["generate"], "model(out)[:, -1, :]", "model(out)[:, 0, :]"),
    "llama2c_hidden_dim": (LLAMA2C_FFN, ["ffn"], "F.silu(self.w1(x)) * self.w3(x)", "self.w1(x) * self.w3(x)"),
}


@pytest.mark.parametrize("case", MORE_CASES)
def test_more_learner_styles_are_checked_whole_and_a_planted_mistake_fails(tmp_path, case):
    """nanochat's GPT (norms as a function without gains, the loss alone returned with targets, the
    config's sequence_len), Umar Jamil's block driven one token at a time through its own cache, GPT-2's
    sample_sequence that names no block size, llama2.c's ModelArgs.hidden_dim beside dim."""
    source, kinds, right, wrong = MORE_CASES[case]
    assert right in source
    correct = _statuses(tmp_path, "correct", source, kinds)
    assert sorted(c.kind for c in correct.values()) == sorted(kinds), correct
    assert all(c.status == "pass" for c in correct.values()), {
        n: (c.status, c.error, c.findings, [k for k in c.checks if not k.ok]) for n, c in correct.items()}
    if wrong is not None:
        planted = _statuses(tmp_path, "planted", source.replace(right, wrong, 1), kinds)
        assert any(c.status == "fail" for c in planted.values()), {
            n: (c.status, c.error) for n, c in planted.items()}


def test_a_block_driven_one_token_at_a_time_is_localized_at_its_line(tmp_path):
    """Umar Jamil's block (its KV cache inside, start_pos, no mask) whose FFN's residual is taken from
    x, not h: no catalogued mistake; the departure is found on one token's step, its line quoted."""
    wrong = "return x + self.w2(F.relu(self.w1(self.ffn_norm(h))))"
    planted = _statuses(tmp_path, "planted", UMAR_MODEL.replace("return h + self.w2(", "return x + self.w2(", 1),
                        ["block"])
    assert [(f.name, f.code) for f in planted["EncoderBlock"].findings] == [(DEPARTS, wrong)], (
        planted["EncoderBlock"].findings)


def test_parts_no_reference_has_are_held_and_a_mistake_elsewhere_still_fails(tmp_path):
    """nanochat's value embeddings (at zero) and residual scalars (as built) are held and named; the
    attention and block are handed None for the value embedding their forward tests against None; the
    soft-cap is read (30); a cap written wrong FAILs at its line, a held part written wrong is NOT CHECKED."""
    assert "extra_v is not None" in NANOCHAT_SCALARS and "/ 30.0) * 30.0" in NANOCHAT_SCALARS
    kinds = ["gpt", "block", "causal_attention"]
    correct = _statuses(tmp_path, "correct", NANOCHAT_SCALARS, kinds)
    assert {c.status for c in correct.values()} == {"pass"}, {n: (c.status, c.error) for n, c in correct.items()}
    held = " ".join(n["en"] for n in correct["GPT"].notes)
    assert "v_tables.0 (29, 16), skip_scale (2,), embed_mix (2,) held" in held, held
    capped = NANOCHAT_SCALARS.replace(" / 30.0) * 30.0", ") * 30.0")
    (gpt,) = _statuses(tmp_path, "capped", capped, ["gpt"]).values()
    said = [f"line {f.line}: {f.code}" for f in gpt.findings]
    assert gpt.status == "fail" and "line 88: logits = torch.tanh(self.lm_head(rms(x))) * 30.0" in said, said
    mixed = NANOCHAT_SCALARS.replace("self.embed_mix[i] * first", "self.embed_mix[i] * x")
    (gpt,) = _statuses(tmp_path, "mixed", mixed, ["gpt"]).values()
    assert gpt.status in ("pass", "not_checked"), (gpt.status, gpt.notes)  # zero mix: the same either way


def test_a_block_with_an_optional_mask_in_a_file_with_nothing_causal_is_an_encoder_layer(tmp_path, monkeypatch):
    """The paper's encoder block named TransformerBlock is an encoder layer by what it does; its -inf
    fill gives NaN only on rows with every key masked, which come only with padding: a file that never
    speaks of padding passes (noted); one that does DIFFERS (as torch.nn's attention does, noted)."""
    from handformer.check.core.conventions import nan_only_on_masked_rows
    from handformer.check.core.discovery import find_components
    from handformer.check.core.result import Finding

    path = tmp_path / "encoder_block.py"
    path.write_text(ENCODER_BLOCK)
    spec = importlib.util.spec_from_file_location("learner_encoder_block", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert [(c.kind, c.name) for c in find_components(module)] == [("encoder_layer", "TransformerBlock")]
    findings, notes = [Finding("nan_on_masked_rows", {"en": "", "zh": ""})], []
    assert nan_only_on_masked_rows(ENCODER_BLOCK, findings, notes) == "pass" and not findings and notes
    padded = ENCODER_BLOCK.replace("mask=None", "pad_mask=None")
    findings, notes = [Finding("nan_on_masked_rows", {"en": "", "zh": ""})], []
    assert nan_only_on_masked_rows(padded, findings, notes) == "differs" and not findings
    assert "torch.nn.MultiheadAttention" in notes[0]["en"]
    two = [Finding("nan_on_masked_rows", {"en": "", "zh": ""}), Finding("causal_off_by_one", {"en": "", "zh": ""})]
    assert nan_only_on_masked_rows(padded, two, []) is None and len(two) == 2


LLAMA2C = '''from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelArgs:
    dim: int = 64
    n_heads: int = 4
    n_kv_heads: Optional[int] = None
    hidden_dim: Optional[int] = None
    multiple_of: int = 32
    norm_eps: float = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rotary_emb(xq, xk, freqs_cos, freqs_sin):  # x (B, T, H, Dh); tables (T, Dh/2)
    cos, sin = freqs_cos[None, :, None], freqs_sin[None, :, None]
    out = []
    for x in (xq, xk):
        re, im = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
        out.append(torch.stack([re * cos - im * sin, re * sin + im * cos], -1).flatten(3).type_as(x))
    return out


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_heads, self.n_kv = args.n_heads, args.n_kv_heads or args.n_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv * self.head_dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x, freqs_cos, freqs_sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv, self.head_dim)
        q, k = apply_rotary_emb(q, k, freqs_cos, freqs_sin)
        k, v = (t.repeat_interleave(self.n_heads // self.n_kv, dim=2) for t in (k, v))
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, multiple_of, dropout):
        super().__init__()
        hidden_dim = hidden_dim or multiple_of * ((8 * dim // 3 + multiple_of - 1) // multiple_of)
        self.w1, self.w3 = nn.Linear(dim, hidden_dim, bias=False), nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Module):
    def __init__(self, layer_id, args):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim, args.multiple_of, 0.0)
        self.attention_norm = RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x, freqs_cos, freqs_sin):
        h = x + self.attention(self.attention_norm(x), freqs_cos, freqs_sin)
        return h + self.feed_forward(self.ffn_norm(h))
'''

# llama2.c's style (and the Chinese courses built on it): its RMSNorm(dim, eps) with no default, its
# tables freqs_cos and freqs_sin (T, Dh/2) handed to apply_rotary_emb(xq, xk, freqs_cos, freqs_sin)
# and to the layer, the config's hidden_dim (None) the FFN's width beside dim, and a decoder-only
# model's layer called DecoderLayer
CASES.update({
    "llama2c_rmsnorm": (LLAMA2C, ["rmsnorm"], ".mean(-1, keepdim=True)", ".sum(-1, keepdim=True)"),
    "llama2c_rope": (LLAMA2C, ["rope"], "re * sin + im * cos", "re * sin - im * cos"),
    "llama2c_attention": (LLAMA2C, ["causal_attention"], "is_causal=True)", "is_causal=True, scale=1.0)"),
    "llama2c_layer": (LLAMA2C, ["block"], "h + self.feed_forward(self.ffn_norm(h))",
                      "h + self.feed_forward(self.attention_norm(h))"),
})

UMAR_PIECES = '''import torch
from torch import nn


class FeedForwardBlock(nn.Module):
    def __init__(self, d_model, d_ff, dropout):
        super().__init__()
        self.linear_1, self.linear_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.linear_2(torch.relu(self.linear_1(x)))


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.cache = torch.zeros(4, 16, d_model)  # a plain tensor attribute, as Umar's KV cache

    def forward(self, x):
        B, T, _ = x.shape
        cache = self.cache.clone()
        cache[:B, :T] = x
        return self.w2(torch.relu(self.w1(cache[:B, :T])))
'''


# Umar Jamil's FeedForwardBlock is an FFN, not a block; a tensor kept as a plain attribute (his KV
# cache) is put in float64 with the module
CASES.update({
    "umar_pieces": (UMAR_PIECES, ["ffn"], "self.linear_2(torch.relu(", "self.linear_2(torch.sigmoid("),
})

HALF_COMPLEX = '''import torch


def apply_rotary(x, freqs_cis):  # x (B, T, H, Dh); freqs_cis (T, Dh/2) complex
    first, second = x.float().chunk(2, dim=-1)  # (B, T, H, Dh/2) each
    pairs = torch.complex(first, second) * freqs_cis[:, None]
    return torch.cat([pairs.real, pairs.imag], dim=-1).type_as(x)
'''


# Gemma's layout: a complex freqs_cis that rotates dimension j with j + Dh/2 (half-split), not 2j with 2j + 1
CASES.update({
    "half_split_complex_rope": (HALF_COMPLEX, ["rope"], "[pairs.real, pairs.imag]", "[pairs.imag, pairs.real]"),
})

SWITCHED = '''import math

import torch


def attention(q, k, v, drop=None, is_causal=False, mask=None):  # q, k, v (B, H, T, Dh)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, T)
    if is_causal:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    return drop(torch.softmax(scores, dim=-1)) @ v
'''


# tiny-universe's free attention: a dropout module that defaults to None but is always called, and a
# mask used only under its causal switch: driven as its own file calls it
CASES.update({
    "switched_free_attention": (SWITCHED, ["sdpa"], "/ math.sqrt(q.size(-1))", "* math.sqrt(q.size(-1))"),
})

CAUSAL_SWITCH = '''import math

import torch
from torch import nn


class SwitchedAttention(nn.Module):
    def __init__(self, d_model, n_heads, is_causal=False):
        super().__init__()
        self.n_heads, self.is_causal = n_heads, is_causal
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.register_buffer("tril", torch.tril(torch.ones(64, 64)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, -1).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
        scores = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1))  # (B, H, T, T)
        if self.is_causal:
            scores = scores.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))
'''


# tiny-universe's MultiHeadAttention(config, is_causal=False): a causal attention is built with its switch on
CASES.update({
    "causal_switch_attention": (CAUSAL_SWITCH, ["causal_attention"], "/ math.sqrt(k.size(-1))",
                                "* math.sqrt(k.size(-1))"),
})

MASKLESS_ENCODER = '''import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (f(x).view(B, T, self.n_heads, -1).transpose(1, 2) for f in (self.q, self.k, self.v))  # (B, H, T, Dh)
        return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C))


class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def forward(self, x):
        x = self.norm1(x + self.attn(x))
        return self.norm2(x + self.ffn(x))
'''


# tiny-universe's EncoderLayer.forward(x): an encoder layer that takes no mask is compared with none
CASES.update({
    "maskless_encoder_layer": (MASKLESS_ENCODER, ["encoder_layer"], "self.norm1(x + self.attn(x))",
                               "self.norm1(self.attn(x))"),
})

COURSE_ARGS = '''import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Settings:
    dim: int
    n_heads: int
    dropout: float
    max_seq_len: int
    vocab_size: int
    n_layer: int


class MultiHeadAttention(nn.Module):
    def __init__(self, args: Settings, is_causal=False):
        super().__init__()
        self.n_heads, self.head_dim = args.n_heads, args.dim // args.n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(args.dim, args.dim, bias=False) for _ in range(4))
        self.is_causal = is_causal
        if is_causal:
            future = torch.triu(torch.full((args.max_seq_len, args.max_seq_len), float("-inf")), diagonal=1)
            self.register_buffer("future", future)

    def forward(self, q, k, v):
        B, T, _ = q.shape
        S = k.size(1)
        q = self.wq(q).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        k = self.wk(k).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, S, Dh)
        v = self.wv(v).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim)  # (B, H, T, S)
        if self.is_causal:
            scores = scores + self.future[:T, :S]
        out = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, -1)
        return self.wo(out)


class MLP(nn.Module):
    def __init__(self, args: Settings):
        super().__init__()
        self.up, self.down = nn.Linear(args.dim, 4 * args.dim), nn.Linear(4 * args.dim, args.dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class EncoderLayer(nn.Module):
    def __init__(self, args: Settings):
        super().__init__()
        self.attention = MultiHeadAttention(args)
        self.ffn = nn.Sequential(nn.Linear(args.dim, args.dim), nn.ReLU(), nn.Linear(args.dim, args.dim))
        self.norm_1, self.norm_2 = nn.LayerNorm(args.dim), nn.LayerNorm(args.dim)

    def forward(self, x):
        x = self.norm_1(x + self.attention(x, x, x))
        return self.norm_2(x + self.ffn(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: Settings):
        super().__init__()
        self.norm_1, self.norm_2, self.norm_3 = (nn.LayerNorm(args.dim) for _ in range(3))
        self.self_attention = MultiHeadAttention(args, is_causal=True)
        self.cross_attention = MultiHeadAttention(args)
        self.mlp = MLP(args)

    def forward(self, x, enc_out):
        x = self.norm_1(x + self.self_attention(x, x, x))
        x = self.norm_2(x + self.cross_attention(x, enc_out, enc_out))
        return self.norm_3(x + self.mlp(x))
'''


# the Chinese courses' style (datawhale): a ModelArgs dataclass whose fields have no defaults, some
# (vocab_size, n_layer) never read by the part built; an attention forward(q, k, v) with its causal
# switch; a decoder layer forward(x, enc_out) that takes no mask (its self-attention causal inside); an
# encoder layer whose FFN is as wide as the model (six square linears)
CASES.update({
    "square_ffn_layer": (COURSE_ARGS, ["encoder_layer"], "self.norm_2(x + self.ffn(x))", "self.norm_2(self.ffn(x))"),
    "required_config_fields": (COURSE_ARGS, ["causal_attention"], "/ math.sqrt(self.head_dim)",
                               "* math.sqrt(self.head_dim)"),
    "maskless_decoder_layer": (COURSE_ARGS, ["decoder_layer"], "self.norm_3(x + self.mlp(x))",
                               "self.norm_3(self.mlp(x))"),
})

FACTORY = '''import math

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.h = h
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, q, k, v, mask):
        B, T, D = q.shape
        split = lambda t: t.view(B, -1, self.h, D // self.h).transpose(1, 2)  # noqa: E731  (B, H, L, Dh)
        q, k, v = split(self.w_q(q)), split(self.w_k(k)), split(self.w_v(v))
        scores = (q @ k.transpose(-2, -1) / math.sqrt(D // self.h)).masked_fill(mask == 0, -1e9)  # (B, H, T, S)
        return self.w_o((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Linear(d_ff, d_model))

    def forward(self, x):
        return self.net(x)


class EncoderLayer(nn.Module):
    def __init__(self, attn: Attention, ff: FeedForward, d_model):
        super().__init__()
        self.attn, self.ff = attn, ff
        self.norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(2)])

    def forward(self, x, mask):
        x = self.norms[0](x + self.attn(x, x, x, mask))
        return self.norms[1](x + self.ff(x))


class DecoderLayer(nn.Module):
    def __init__(self, attn: Attention, cross: Attention, ff: FeedForward, d_model):
        super().__init__()
        self.attn, self.cross, self.ff = attn, cross, ff
        self.norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(3)])

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.norms[0](x + self.attn(x, x, x, tgt_mask))
        x = self.norms[1](x + self.cross(x, memory, memory, src_mask))
        return self.norms[2](x + self.ff(x))


class Positions(nn.Module):
    def __init__(self, d_model, seq_len):
        super().__init__()
        pos = torch.arange(seq_len).unsqueeze(1)  # (L, 1)
        angle = pos * torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (L, D/2)
        table = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # (L, D): sin, cos interleaved
        self.register_buffer("table", table)

    def forward(self, x):
        return x + self.table[: x.size(1)]


class Transformer(nn.Module):
    def __init__(self, encoder: nn.ModuleList, decoder: nn.ModuleList, src_embed: nn.Embedding,
                 tgt_embed: nn.Embedding, pos: Positions, out: nn.Linear):
        super().__init__()
        self.encoder, self.decoder, self.src_embed, self.tgt_embed = encoder, decoder, src_embed, tgt_embed
        self.pos, self.out = pos, out

    def encode(self, src, src_mask):
        x = self.pos(self.src_embed(src) * math.sqrt(self.src_embed.embedding_dim))
        for layer in self.encoder:
            x = layer(x, src_mask)
        return x

    def decode(self, memory, src_mask, tgt, tgt_mask):
        x = self.pos(self.tgt_embed(tgt) * math.sqrt(self.tgt_embed.embedding_dim))
        for layer in self.decoder:
            x = layer(x, memory, src_mask, tgt_mask)
        return x

    def project(self, x):
        return self.out(x)


def assemble(src_vocab_size: int, tgt_vocab_size: int, src_seq_len: int, d_model: int = 512, N: int = 6,
             h: int = 8, d_ff: int = 2048) -> Transformer:
    encoder = nn.ModuleList([EncoderLayer(Attention(d_model, h), FeedForward(d_model, d_ff), d_model)
                             for _ in range(N)])
    decoder = nn.ModuleList([DecoderLayer(Attention(d_model, h), Attention(d_model, h), FeedForward(d_model, d_ff),
                                          d_model) for _ in range(N)])
    return Transformer(encoder, decoder, nn.Embedding(src_vocab_size, d_model), nn.Embedding(tgt_vocab_size, d_model),
                       Positions(d_model, src_seq_len), nn.Linear(d_model, tgt_vocab_size))
'''


# Umar Jamil's style: a model with no forward (encode, decode, project), built from modules by a
# factory function whose return annotation names it, its src_seq_len the positions' length; its
# layers' masks required (the tutorial's shapes are given masks, never None)
CASES.update({
    "factory_without_forward": (FACTORY, ["transformer"], "x = self.pos(self.tgt_embed(tgt) * ",
                                "x = (self.tgt_embed(tgt) * "),
    "decoder_layer_requires_masks": (FACTORY, ["decoder_layer"], "self.norms[1](x + self.cross(",
                                     "self.norms[1](self.cross("),
})

BIGRAM = '''import torch.nn.functional as F
from torch import nn


class CharBigramModel(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.next_token = nn.Embedding(vocab_size, vocab_size)  # row i: the logits of the token after i

    def forward(self, idx, targets=None):
        logits = self.next_token(idx)  # (B, T, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.transpose(1, 2), targets)
'''


# Karpathy's lecture's first model: one token table and nothing else, compared with the bigram it is
CASES.update({
    "bigram_table": (BIGRAM, ["gpt"], "logits.transpose(1, 2), targets)", "logits.transpose(1, 2), idx)"),
})

STREAM = '''import torch


def stream(model, tokens, max_tokens):
    ids = torch.tensor([tokens])  # (1, T): one prompt, a list of ids
    for _ in range(max_tokens):
        logits = model(ids)[:, -1, :]  # (1, V)
        next_id = logits.argmax(-1, keepdim=True)  # (1, 1)
        ids = torch.cat([ids, next_id], dim=1)
        yield next_id.item()
'''


# nanochat's streaming generate: a generator over a list of ids that yields one token at a time
CASES.update({
    "streaming_generate": (STREAM, ["generate"], "model(ids)[:, -1, :]", "model(ids)[:, 0, :]"),
})

TOP_K_PROBS = '''import torch


def top_k_probs(probs, k):
    vals, idx = torch.topk(probs, min(k, probs.size(-1)), dim=-1)
    out = torch.zeros_like(probs).scatter_(-1, idx, vals)
    return out / out.sum(dim=-1, keepdim=True)  # each row renormalized
'''


# a top-k filter on probabilities that renormalizes: over each row, not over the whole batch
CASES.update({
    "top_k_on_probabilities": (TOP_K_PROBS, ["top_k"], "out.sum(dim=-1, keepdim=True)", "out.sum()"),
})


def test_the_adapter_hint_for_a_method_calls_it_on_the_model():
    """nanochat's GPT.generate(self, tokens, max_tokens): the hint calls it on the model check gives."""
    from handformer.check.core.adapters import adapter_hint
    from handformer.check.core.discovery import Component

    class GPT:
        def generate(self, tokens, max_tokens, temperature=1.0):
            yield from tokens[:max_tokens]

    hint = adapter_hint(Component("generate", "GPT.generate", GPT.generate))
    assert "return model.generate(idx, max_new_tokens)" in hint and "self" not in hint


def test_the_adapter_hint_for_a_function_imports_it_and_passes_what_check_gives():
    """A beam_search(model, src, beam_size, max_len, bos_id, eos_id) named as its kind: the hint imports
    it under another name (an adapter calling `beam_search` would call itself) and hands it check's
    start and end symbols where it names them bos_id and eos_id."""
    from handformer.check.core.adapters import adapter_hint
    from handformer.check.core.discovery import Component

    def beam_search(model, src, beam_size, max_len, bos_id, eos_id):
        return src

    hint = adapter_hint(Component("beam_search", "beam_search", torch.no_grad()(beam_search)))
    compile(hint, "handformer_adapters.py", "exec")
    assert f"from {Path(__file__).stem} import beam_search as yours" in hint
    assert "return yours(model, src, beam_size, max_len, start_symbol, end_symbol)" in hint

ADDITIVE = '''import torch
from torch import nn


class AdditiveAttention(nn.Module):
    def __init__(self, key_size, query_size, num_hiddens, dropout):
        super().__init__()
        self.to_hidden_k = nn.Linear(key_size, num_hiddens, bias=False)
        self.to_hidden_q = nn.Linear(query_size, num_hiddens, bias=False)
        self.score = nn.Linear(num_hiddens, 1, bias=False)
        self.drop = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        hidden = torch.tanh(self.to_hidden_q(queries)[:, :, None] + self.to_hidden_k(keys)[:, None])  # (B, T, S, H)
        scores = self.score(hidden).squeeze(-1)  # (B, T, S)
        if valid_lens is not None:
            unseen = torch.arange(keys.size(1))[None, None, :] >= valid_lens[:, None, None]  # (B, 1, S)
            scores = scores.masked_fill(unseen, -1e6)
        return torch.bmm(self.drop(scores.softmax(dim=-1)), values)
'''


# d2l's AdditiveAttention(key_size, query_size, num_hiddens, dropout), forward(queries, keys, values, valid_lens)
CASES.update({
    "additive_attention": (ADDITIVE, ["additive_attention"], "scores.softmax(dim=-1)", "scores.softmax(dim=1)"),
})

OFFSET_NORM = '''import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6, unit_offset=True):
        super().__init__()
        self.eps, self.unit_offset = eps, unit_offset
        self.scale = nn.Parameter(torch.zeros(dim))  # the gain is 1 + scale

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * (1 + self.scale) if self.unit_offset else x * self.scale


class MLP(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden_dim), nn.Linear(hidden_dim, dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))
'''


def test_a_gain_kept_as_an_offset_from_one_is_a_convention(tmp_path):
    """Gemma's RMSNorm(dim, eps, add_unit_offset=True): x̂ · (1 + weight) is handformer's norm with
    the gain 1 + weight (DIFFERS, noted); its defaulted switch, whose name holds "ff", is left to its
    default rather than handed the file's MLP; a gain off by one more FAILs."""
    (norm,) = _statuses(tmp_path, "offset", OFFSET_NORM, ["rmsnorm"]).values()
    assert norm.status == "differs", (norm.status, norm.error)
    assert any("offset from one" in n["en"] for n in norm.notes)
    (wrong,) = _statuses(tmp_path, "planted", OFFSET_NORM.replace("(1 + self.scale)", "(2 + self.scale)"),
                         ["rmsnorm"]).values()
    assert wrong.status == "fail"


GEMMA_SETTINGS = '''import dataclasses
import enum


class Kind(enum.Enum):
    FULL = "full"
    WINDOW = "window"


@dataclasses.dataclass
class Settings:
    hidden_size: int = 64
    num_heads: int = 4
    scalar: float = 16.0
'''

GEMMA_LAYERS = '''from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import settings_file


class GatedMLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int, quantized: bool):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)
        for p in self.parameters():
            p.requires_grad = quantized

    def forward(self, x):
        return self.down(F.gelu(self.gate(x), approximate="tanh") * self.up(x))


class SelfAttention(nn.Module):
    def __init__(self, cfg: settings_file.Settings, kind: settings_file.Kind):
        super().__init__()
        self.kind, self.h = kind, cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.kind is settings_file.Kind.FULL)
        return self.out(y.transpose(1, 2).reshape(B, T, C))
'''


def test_arguments_typed_by_an_enum_a_bool_or_a_config_of_another_file_are_filled(tmp_path):
    """gemma_pytorch's GemmaAttention(config: gemma_config.GemmaConfig, attn_type: AttentionType) and
    GemmaMLP(..., quant: bool): the config class of the other file (its defaults kept), the enum's first
    member, False; weights frozen by the file (requires_grad False) still get their gradients compared."""
    (tmp_path / "settings_file.py").write_text(GEMMA_SETTINGS)
    found = _statuses(tmp_path, "layers", GEMMA_LAYERS, ["ffn", "causal_attention"])
    assert {n: c.status for n, c in found.items()} == {"GatedMLP": "pass", "SelfAttention": "pass"}, {
        n: (c.status, c.error) for n, c in found.items()}
    planted = GEMMA_LAYERS.replace("* self.up(x))", "* self.gate(x))")
    (mlp,) = _statuses(tmp_path, "planted", planted, ["ffn"]).values()
    assert mlp.status == "fail", (mlp.status, mlp.error)


# d2l-en's model: lazy layers everywhere, the blocks in an nn.ModuleList, the model built by a factory
D2L_EN_MODEL = (Path(__file__).parent / "fixtures" / "learners_d2l" / "correct.py").read_text() + '''

class Encoder(nn.Module):
    def __init__(self, vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout):
        super().__init__()
        self.num_hiddens = num_hiddens
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout)
        self.blks = nn.ModuleList([TransformerEncoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout)
                                   for _ in range(num_blks)])

    def forward(self, X, valid_lens):
        X = self.pos_encoding(self.embedding(X) * self.num_hiddens ** 0.5)
        for blk in self.blks:
            X = blk(X, valid_lens)
        return X


class Decoder(nn.Module):
    def __init__(self, vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout):
        super().__init__()
        self.num_hiddens, self.num_blks = num_hiddens, num_blks
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout)
        self.blks = nn.ModuleList([TransformerDecoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout, i)
                                   for i in range(num_blks)])
        self.dense = nn.LazyLinear(vocab_size)

    def init_state(self, enc_outputs, enc_valid_lens):
        return [enc_outputs, enc_valid_lens, [None] * self.num_blks]

    def forward(self, X, state):
        X = self.pos_encoding(self.embedding(X) * self.num_hiddens ** 0.5)
        for blk in self.blks:
            X, state = blk(X, state)
        return self.dense(X), state


class Seq2Seq(nn.Module):
    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, enc_X, dec_X, *args):
        state = self.decoder.init_state(self.encoder(enc_X, *args), *args)
        return self.decoder(dec_X, state)[0]


def build(src_vocab, tgt_vocab, num_hiddens=32, ffn_num_hiddens=64, num_heads=4, num_blks=2, dropout=0.1):
    return Seq2Seq(Encoder(src_vocab, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout),
                   Decoder(tgt_vocab, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout))
'''


def test_a_model_of_lazy_layers_built_by_its_factory_is_run_once_then_compared(tmp_path):
    """d2l-en's nn.LazyLinear layers get their shapes from one call of the model at check's sizes
    (its factory's model too); then it is mapped and compared. A decoder whose embeddings are not
    scaled fails."""
    (model,) = _statuses(tmp_path, "correct", D2L_EN_MODEL, ["transformer"]).values()
    assert model.status == "pass", (model.status, model.error, [c for c in model.checks if not c.ok])
    planted = D2L_EN_MODEL.replace("self.pos_encoding(self.embedding(X) * self.num_hiddens ** 0.5)\n        for blk in"
                                   " self.blks:\n            X, state", "self.pos_encoding(self.embedding(X))\n"
                                   "        for blk in self.blks:\n            X, state")
    assert planted != D2L_EN_MODEL
    (model,) = _statuses(tmp_path, "planted", planted, ["transformer"]).values()
    assert model.status == "fail", (model.status, model.error)
