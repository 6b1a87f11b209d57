"""What the grader hands a learner's code and what it counts as a component (small files written in
each style here, each correct one checked against torch when written): tensor2tensor's attention takes
its mask as the additive `bias` on the scores."""

from __future__ import annotations

import pytest

from handformer.check.core.engine import check_file

pytestmark = pytest.mark.usefixtures("one_thread")

T2T = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.depth = num_heads, hidden_size // num_heads
        self.q = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v = nn.Linear(hidden_size, hidden_size, bias=False)
        self.output_transform = nn.Linear(hidden_size, hidden_size, bias=False)

    def split_heads(self, x):  # [b, l, d] -> [b, h, l, d/h]
        return x.view(x.size(0), x.size(1), self.num_heads, self.depth).transpose(1, 2)

    def forward(self, x, bias=None):
        q = self.split_heads(self.q(x)) * self.depth ** -0.5
        k, v = self.split_heads(self.k(x)), self.split_heads(self.v(x))
        logits = torch.matmul(q, k.transpose(-1, -2))
        if bias is not None:
            logits = logits + bias  # 0 or -1e9, broadcast to [b, h, l, l]
        out = torch.matmul(F.softmax(logits, dim=-1), v)
        return self.output_transform(out.transpose(1, 2).reshape(x.shape))
'''


def _components(tmp_path, name, source, kinds):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return {c.kind: c for c in check_file(str(path), only=kinds).components}


def test_an_attention_taking_its_mask_as_an_additive_bias_passes_and_a_plant_fails(tmp_path):
    (attention,) = _components(tmp_path, "t2t", T2T, ["mha"]).values()
    assert attention.status == "pass", attention
    assert "additive" in attention.convention["en"]
    right = "self.depth ** -0.5"
    planted = T2T.replace(right, "(self.num_heads * self.depth) ** -0.5")
    (attention,) = _components(tmp_path, "t2t_planted", planted, ["mha"]).values()
    assert attention.status == "fail" and attention.findings[0].line == 19, attention


TOY_LM = '''import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyCausalLM(nn.Module):
    """一个很小的单层因果语言模型，只是为了让 generate 能跑起来"""

    def __init__(self, vocab_size=32, d_model=16):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def forward(self, idx):
        T = idx.size(1)
        x = self.tok_emb(idx)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.lm_head(x + att @ v)


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0):
    for _ in range(max_new_tokens):
        logits = model(idx)[:, -1, :] / temperature
        idx = torch.cat([idx, torch.multinomial(F.softmax(logits, dim=-1), 1)], dim=1)
    return idx
'''


def test_a_toy_model_that_drives_a_loop_is_a_driver_and_one_that_sees_ahead_fails(tmp_path):
    from handformer.check.core.report import exit_code

    path = tmp_path / "toy_lm.py"
    path.write_text(TOY_LM)
    result = check_file(str(path), only=["gpt"])
    (model,) = result.components
    assert (model.kind, model.status) == ("gpt", "driver"), model
    assert exit_code(result) == 0
    leaky = TOY_LM.replace('att.masked_fill(~causal, float("-inf"))', "att")
    (model,) = _components(tmp_path, "toy_lm_planted", leaky, ["gpt"]).values()
    assert model.status == "fail" and not model.checks[-1].ok, model


HF_CAUSAL_MASKS = {
    "batch_length_dtype": '''import torch


def make_causal_mask(bsz, tgt_len, dtype=torch.float32):
    # 上三角（不含对角线）填最小值，其余为 0，形状 [bsz, 1, tgt_len, tgt_len]
    mask = torch.triu(torch.full((tgt_len, tgt_len), torch.finfo(dtype).min), diagonal=1)
    return mask[None, None, :, :].expand(bsz, 1, tgt_len, tgt_len).to(dtype)
''',
    "padding_mask_dtype": '''import torch


def make_causal_mask(attention_mask, dtype):
    """(bsz, seq) padding mask (1 = token, 0 = pad) -> (bsz, 1, seq, seq) additive float mask"""
    bsz, seq_len = attention_mask.shape
    min_value = torch.finfo(dtype).min
    causal = torch.triu(torch.full((seq_len, seq_len), min_value, dtype=dtype), diagonal=1)
    padding = (1.0 - attention_mask[:, None, None, :].to(dtype)) * min_value
    return (causal[None, None, :, :] + padding).clamp(min=min_value)
''',
}


@pytest.mark.parametrize("form", sorted(HF_CAUSAL_MASKS))
def test_a_causal_mask_function_taking_a_batch_or_a_padding_mask_and_a_dtype_is_driven(tmp_path, form):
    source = HF_CAUSAL_MASKS[form]
    (mask,) = _components(tmp_path, form, source, ["causal_mask"]).values()
    assert mask.status == "pass", mask
    planted = source.replace("diagonal=1", "diagonal=2")
    (mask,) = _components(tmp_path, f"{form}_planted", planted, ["causal_mask"]).values()
    assert mask.status == "fail" and "causal_off_by_one" in [f.name for f in mask.findings], mask
    assert "diagonal=2" in mask.findings[0].code


PRE_NORM_KEY_PADDING = '''import math

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, d_model, nhead):
        super().__init__()
        self.nhead, self.head_dim = nhead, d_model // nhead
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, attn_mask=None, key_padding_mask=None):
        B, S, E = x.shape
        q, k, v = (p(x).view(B, S, self.nhead, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if attn_mask is not None:
            scores = scores + attn_mask  # additive float mask
        if key_padding_mask is not None:  # (B, S), True = padding
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        out = F.softmax(scores, dim=-1) @ v
        return self.out_proj(out.transpose(1, 2).reshape(B, S, E))


class PreNormEncoderLayer(nn.Module):
    def __init__(self, d_model, nhead, dim_feedforward):
        super().__init__()
        self.self_attn = SelfAttention(d_model, nhead)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, src, src_mask=None, src_key_padding_mask=None):
        x = src + self.self_attn(self.norm1(src), src_mask, src_key_padding_mask)
        return x + self.linear2(F.relu(self.linear1(self.norm2(x))))

'''


def test_a_key_padding_mask_that_hides_queries_fails_in_the_attention_and_its_pre_norm_layer(tmp_path):
    """Given alone as (B, S) True = padding, a key_padding_mask applied as (B, 1, S, 1) hides the padded
    queries, not the keys: the attention fails (read as True = keep, every real query is NaN: that form
    is not taken) and so does its pre-norm layer (the padded positions changed by a vector of many values,
    which LayerNorm keeps, not 5.0 on every feature, which it takes away)."""
    found = _components(tmp_path, "pre_norm", PRE_NORM_KEY_PADDING, ["mha", "encoder_layer"])
    assert [c.status for c in found.values()] == ["pass", "differs"], found
    planted = PRE_NORM_KEY_PADDING.replace("key_padding_mask[:, None, None, :]", "key_padding_mask[:, None, :, None]")
    found = _components(tmp_path, "pre_norm_planted", planted, ["mha", "encoder_layer"])
    failed = {kind: [ch.name["en"].split()[0] for ch in c.checks if not ch.ok] for kind, c in found.items()}
    assert failed == {"mha": ["key_padding_mask"], "encoder_layer": ["src_key_padding_mask"]}, found


T2T_ENCODER = T2T + '''

class EncoderLayer(nn.Module):
    def __init__(self, hidden_size, num_heads, filter_size):
        super().__init__()
        self.self_attention = Attention(hidden_size, num_heads)
        self.conv1 = nn.Linear(hidden_size, filter_size)  # t2t: dense_relu_dense
        self.conv2 = nn.Linear(filter_size, hidden_size)
        self.norm1 = nn.LayerNorm(hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(hidden_size, eps=1e-6)

    def forward(self, x, bias=None):
        x = self.norm1(x + self.self_attention(x, bias))
        return self.norm2(x + self.conv2(F.relu(self.conv1(x))))


class TransformerEncoder(nn.Module):
    def __init__(self, vocab_size, hidden_size=64, num_heads=4, filter_size=256, num_layers=2):
        super().__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.ModuleList(
            [EncoderLayer(hidden_size, num_heads, filter_size) for _ in range(num_layers)])

    def forward(self, inputs, pad_mask=None):
        x = self.embedding(inputs) * self.hidden_size ** 0.5
        bias = None if pad_mask is None else (pad_mask.float() * -1e9)[:, None, None, :]
        h = x
        for layer in self.layers:
            h = layer(h, bias)
        return h
'''


def test_a_model_returning_hidden_states_is_checked_as_the_stack_of_its_layers(tmp_path):
    """An encoder with no output layer (tensor2tensor's) returns hidden states: each layer must be handed
    what the one before returned; one that hands every layer the embeddings FAILs at its call."""
    (model,) = _components(tmp_path, "t2t_encoder", T2T_ENCODER, ["gpt"]).values()
    assert model.status == "pass" and len(model.checks) == 3, model
    planted = T2T_ENCODER.replace("h = layer(h, bias)", "h = layer(x, bias)")
    (model,) = _components(tmp_path, "t2t_encoder_planted", planted, ["gpt"]).values()
    assert model.status == "fail" and model.findings[0].code == "h = layer(x, bias)", model


LUCID_STACK = '''import torch
from torch import nn


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, dim))

    def forward(self, x):
        return self.net(x)


class Attention(nn.Module):
    def __init__(self, dim, heads=8, dim_head=64):
        super().__init__()
        inner = dim_head * heads
        self.heads, self.scale = heads, dim_head ** -0.5
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.to_qkv(self.norm(x)).chunk(3, dim=-1))
        attn = (q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1)
        return self.to_out((attn @ v).transpose(1, 2).reshape(b, n, -1))


class Transformer(nn.Module):
    def __init__(self, dim, depth, heads, dim_head, mlp_dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList([nn.ModuleList([Attention(dim, heads, dim_head), FeedForward(dim, mlp_dim)])
                                     for _ in range(depth)])

    def forward(self, x):
        for attn, ff in self.layers:
            h = attn(x) + x
            x = ff(h) + h
        return self.norm(x)
'''


def test_a_stack_of_vectors_with_its_residuals_outside_its_sublayers_passes_and_a_miswired_one_fails(tmp_path):
    """lucidrains' Transformer(dim, depth, ...) takes vectors, no token ids, and keeps each layer as a
    ModuleList([attn, ff]) whose residuals its own loop adds (`x = attn(x) + x`): checked as a stack of
    those sublayers; a loop that adds the layer's input to the FFN's output, not the attention's, FAILs."""
    (model,) = _components(tmp_path, "lucid_stack", LUCID_STACK, ["gpt"]).values()
    assert model.status == "pass", model
    planted = LUCID_STACK.replace("x = ff(h) + h", "x = ff(h) + x")
    (model,) = _components(tmp_path, "lucid_stack_planted", planted, ["gpt"]).values()
    assert model.status == "fail" and model.findings[0].code == "x = ff(h) + x", model
