"""`handformer check` on the styles learners write besides the tutorials': the LLM chapter's modern
block (RMSNorm, SwiGLU, rotary positions, grouped-query attention, pre-norm), d2l's (valid_lens,
masked_softmax, heads folded into the batch, lazy layers, AddNorm, a decoder with `state`), nanoGPT's
(a config object, a fused c_attn, the mask buffer), and the 手写 03 tutorial's own code, cut out of
the tutorial at test time. Each correct file passes component by component.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import correct_file
from helpers import missing

from handformer.check.report import exit_code, format_report
from handformer.check.runners import check_file

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT.parent / "shared" / "seeds" / "000_c08da9847aeea07c.txt"  # 手写 03

KINDS = {
    "llm": [("GroupedQueryAttention", "gqa"), ("repeat_kv", "gqa"), ("apply_rotary_pos_emb", "rope"),
            ("RotaryEmbedding", "rope"), ("SwiGLU", "ffn"), ("RMSNorm", "rmsnorm"), ("TransformerBlock", "block")],
    "d2l": [("masked_softmax", "masked_softmax"), ("DotProductAttention", "sdpa"), ("MultiHeadAttention", "mha"),
            ("PositionWiseFFN", "ffn"), ("PositionalEncoding", "positional_encoding"), ("AddNorm", "add_norm"),
            ("TransformerEncoderBlock", "encoder_layer"), ("TransformerDecoderBlock", "decoder_layer")],
    "nanogpt": [("CausalSelfAttention", "causal_attention"), ("MLP", "ffn"), ("LayerNorm", "layernorm"),
                ("Block", "block"), ("GPT", "gpt"), ("GPT.generate", "generate")],
}


@pytest.mark.parametrize("family", list(KINDS))
def test_the_correct_file_of_each_style_passes(family):
    result = check_file(str(correct_file(family)))
    assert [(c.name, c.kind) for c in result.components] == KINDS[family]
    assert all(c.status == "pass" for c in result.components), format_report(result)
    assert exit_code(result) == 0


def test_d2l_conventions_are_read_as_d2l_writes_them():
    """valid_lens (per batch row, per query, and repeated over the heads), heads folded into the
    batch, lazy layers given their shapes by a first call, and the decoder run step by step."""
    result = check_file(str(correct_file("d2l")), only=["sdpa", "mha", "decoder_layer"])
    sdpa, mha, decoder = result.components
    for c in result.components:
        assert c.convention["en"].startswith("valid lengths (d2l's valid_lens)"), format_report(result)
    assert mha.mapping == ["W_q -> W_Q", "W_k -> W_K", "W_v -> W_V", "W_o -> W_O"]
    assert any("step by step" in ch.name["en"] and ch.ok for ch in decoder.checks)
    assert any("training mode" in n["en"] for n in decoder.notes)
    assert "有效长度（d2l 的 valid_lens）" in format_report(result, "zh")


def test_the_llm_block_is_compared_with_grouped_query_attention_and_rotary_positions():
    result = check_file(str(correct_file("llm")), only=["block", "rope"])
    block = next(c for c in result.components if c.kind == "block")
    assert "attn.k_proj -> W_K" in block.mapping and any("rotary positions inside" in n["en"] for n in block.notes)
    rope = [c for c in result.components if c.kind == "rope"]
    assert all(c.convention["en"].startswith("pairs (j, j + d/2)") for c in rope)


META_STYLE = '''
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def precompute_freqs_cis(dim, end, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)
    angles = torch.outer(torch.arange(end).float(), inv)
    return torch.polar(torch.ones_like(angles), angles)  # (end, dim / 2) complex


def apply_rotary_emb(xq, xk, freqs_cis):
    # xq, xk: (batch, seq, heads, head_dim); neighbouring dimensions form one complex number
    cq = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    ck = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    rot = freqs_cis[None, :, None, :]
    return (torch.view_as_real(cq * rot).flatten(3).type_as(xq),
            torch.view_as_real(ck * rot).flatten(3).type_as(xk))


class Attention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x, freqs_cis, mask=None):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        q, k = apply_rotary_emb(q, k, freqs_cis)
        rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        out = F.softmax(scores, dim=-1) @ v
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))
'''


def test_meta_style_rotary_positions_and_grouped_query_attention(tmp_path):
    """Meta's complex freqs_cis (interleaved pairs: a convention, compared with W_Q and W_K permuted),
    an attention handed freqs_cis with fewer key/value heads, and the base read back from the table."""
    path = tmp_path / "meta.py"
    path.write_text(META_STYLE)
    result = check_file(str(path))
    assert [(c.name, c.kind, c.status) for c in result.components] == [
        ("Attention", "gqa", "pass"), ("apply_rotary_emb", "rope", "pass"), ("precompute_freqs_cis", "rope", "pass")
    ], format_report(result)
    assert any("interleaved pairs" in n["en"] for n in result.components[0].notes)
    assert all(c.convention["en"].startswith("pairs (2j, 2j+1)") for c in result.components[1:])
    for base, form in (("1000.0", "base"), ("10000.0", "ignored")):  # a wrong base; the argument not used
        path.write_text(META_STYLE.replace("1.0 / theta ** (", f"1.0 / {base} ** ("))
        (table,) = check_file(str(path), only=["rope"]).components[1:]
        assert [(f.name, f.form) for f in table.findings] == [("rope_wrong_base", form)], table.findings


MISSING_RESIDUAL = '''
import copy
import math

import torch
import torch.nn as nn


def clones(module, n):
    return nn.ModuleList([copy.deepcopy(module) for _ in range(n)])


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.linears = clones(nn.Linear(d_model, d_model), 4)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        n = query.size(0)
        q, k, v = [lin(x).view(n, -1, self.h, self.d_k).transpose(1, 2)
                   for lin, x in zip(self.linears, (query, key, value))]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        x = scores.softmax(dim=-1) @ v
        return self.linears[3](x.transpose(1, 2).contiguous().view(n, -1, self.h * self.d_k))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.w_2(self.w_1(x).relu())


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout):
        super().__init__()
        self.norm, self.dropout = nn.LayerNorm(size), nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return self.dropout(sublayer(self.norm(x)))  # the residual x + ... is missing


class EncoderLayer(nn.Module):
    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__()
        self.self_attn, self.feed_forward = self_attn, feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout), 2)

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)
'''


def test_an_annotated_layer_without_its_residual_fails_and_the_grader_does_not(tmp_path):
    """The Annotated Transformer's SublayerConnection without `x +`: the layer fails its checks (its
    rows of fully masked queries are not compared) and no exception of handformer's reaches the report."""
    path = tmp_path / "annotated.py"
    path.write_text(MISSING_RESIDUAL)
    result = check_file(str(path), only=["encoder_layer"])
    (layer,) = result.components
    assert layer.error is None and layer.status == "fail", format_report(result)
    assert {f.name for f in layer.findings} == {"no_residual"}


def tutorial_classes(text: str) -> str:
    """The classes of 手写 03, cut out by fixed anchors (the text has no fenced code blocks): from each
    line that starts with `class ` through its indented body, with the imports the tutorial writes."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        if not lines[i].startswith("class "):
            i += 1
            continue
        block = [lines[i]]
        i += 1
        while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
            block.append(lines[i])
            i += 1
        blocks.append("\n".join(block).rstrip())
    header = "import math\n\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
    return header + "\n\n" + "\n\n\n".join(blocks) + "\n"


def test_the_tutorials_own_code_passes(tmp_path):
    """手写 03's MultiHeadAttention, FFN, EncoderLayer and DecoderLayer, as the tutorial prints them,
    pass every check (written to a temporary file, never into the project)."""
    if not TUTORIAL.is_file():
        missing(f"the tutorial {TUTORIAL} is not there (CI has ../shared/seeds)")
    path = tmp_path / "tutorial_03.py"
    path.write_text(tutorial_classes(TUTORIAL.read_text(encoding="utf-8")))
    result = check_file(str(path))
    assert [(c.name, c.kind) for c in result.components] == [
        ("MultiHeadAttention", "mha"), ("FFN", "ffn"), ("EncoderLayer", "encoder_layer"),
        ("DecoderLayer", "decoder_layer")], format_report(result)
    assert all(c.status == "pass" for c in result.components), format_report(result)
