"""`handformer check` on the styles learners write besides the tutorials': the LLM chapter's modern
block (RMSNorm, SwiGLU, rotary positions, grouped-query attention, pre-norm), d2l's (valid_lens,
masked_softmax, heads folded into the batch, lazy layers, AddNorm, a decoder with `state`), nanoGPT's
(a config object, a fused c_attn, the mask buffer), and the 手写 03 tutorial's own code, cut out of
the tutorial at test time. Each correct file passes component by component.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from check_plants import FAMILIES, WRITTEN, WRITTEN_PLANTS, correct_file, written_file, written_source
from helpers import missing

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report, to_json

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


# --- learner files written here in the styles learners copy (tests/check_plants.py: WRITTEN) -------

WRITTEN_KINDS = {
    "karpathy": [("MultiHeadAttention", "causal_attention", "pass"), ("FeedFoward", "ffn", "pass"), ("Block", "block", "pass"),
                 ("GPTLanguageModel", "gpt", "pass"), ("GPTLanguageModel.generate", "generate", "pass")],
    "raschka": [("MultiHeadAttention", "causal_attention", "pass"), ("FeedForward", "ffn", "pass"),
                ("LayerNorm", "layernorm", "pass"), ("TransformerBlock", "block", "pass"), ("GPTModel", "gpt", "pass"),
                ("generate", "generate", "pass")],
    "llama": [("Attention", "gqa", "pass"), ("repeat_kv", "gqa", "pass"), ("apply_rotary_emb", "rope", "pass"),
              ("precompute_freqs_cis", "rope", "pass"), ("FeedForward", "ffn", "pass"), ("RMSNorm", "rmsnorm", "pass"),
              ("TransformerBlock", "block", "pass"), ("Transformer", "gpt", "pass"), ("sample_top_p", "sample", "pass")],
    "minimind": [("repeat_kv", "gqa", "pass"), ("Attention", "causal_attention", "pass"),
                 ("apply_rotary_pos_emb", "rope", "pass"), ("precompute_freqs_cis", "rope", "pass"),
                 ("FeedForward", "ffn", "pass"), ("RMSNorm", "rmsnorm", "pass"), ("MiniMindBlock", "block", "pass"),
                 ("MiniMindForCausalLM", "gpt", "pass")],
    "hf": [("LlamaAttention", "gqa", "pass"), ("apply_rotary_pos_emb", "rope", "pass"),
           ("LlamaRotaryEmbedding", "rope", "pass"), ("LlamaMLP", "ffn", "pass"), ("LlamaRMSNorm", "rmsnorm", "pass"),
           ("LlamaDecoderLayer", "block", "pass"), ("LlamaForCausalLM", "gpt", "pass")],
    "decoding": [("top_k_top_p_filtering", "top_p", "pass"), ("sample_top_p", "sample", "pass"),
                 ("train_step", "train_step", "pass")],
    "carried": [("make_src_mask", "mask_helper", "pass"), ("make_tgt_mask", "mask_helper", "pass"),
                ("scaled_dot_product_attention", "sdpa", "pass"), ("MultiHeadAttention", "mha", "pass"),
                ("FFN", "ffn", "pass"), ("PositionalEncoding", "positional_encoding", "pass"),
                ("EncoderLayer", "encoder_layer", "pass"), ("DecoderLayer", "decoder_layer", "pass"),
                ("Transformer", "transformer", "pass"), ("rate", "schedule", "pass"), ("LabelSmoothing", "loss", "pass"),
                ("greedy_decode", "greedy_decode", "pass")],
    "lmloop": [("warmup_cosine", "schedule", "pass"), ("train_step", "lm_train_step", "pass")],
    "kvcache": [("MultiHeadAttention", "causal_attention", "pass"), ("apply_rope", "rope", "pass"),
                ("RMSNorm", "rmsnorm", "pass"), ("TransformerBlock", "block", "pass"), ("GPTModel", "gpt", "pass"),
                ("get_lr", "schedule", "pass"), ("generate_cached", "generate", "pass")],
    "torchnn": [("generate_square_subsequent_mask", "causal_mask", "pass"), ("create_mask", "mask_helper", "pass"),
                ("EncoderLayer", "encoder_layer", "pass"), ("DecoderLayer", "decoder_layer", "pass"),
                ("TranslationModel", "transformer", "pass"), ("greedy_decode", "greedy_decode", "pass"),
                ("beam_search", "beam_search", "pass"), ("train_step", "train_step", "pass")],
}


@pytest.mark.parametrize("family", list(WRITTEN_KINDS))
def test_a_written_style_is_built_and_driven_and_never_failed(family):
    """Configs as dicts, dataclasses and config classes; module-level hyperparameters; heads as a
    list of single heads; a model with no arguments; generation as a free function with
    context_size; Meta's decoder-only `Transformer` with its start_pos cache; minimind's (cos, sin);
    Hugging Face's (B, T, Dh) tables and output object; filters on probabilities and combined ones; a
    clipped training step. Every component is built, driven and passes (exit 0)."""
    result = check_file(str(WRITTEN[family] / "correct.py"))
    assert [(c.name, c.kind, c.status) for c in result.components] == WRITTEN_KINDS[family], format_report(result)
    unchecked = [c for c in result.components if c.status == "not_checked"]
    assert exit_code(result) == (3 if unchecked else 0)
    assert all(c.error.message.startswith("not compared with handformer's CausalLM") for c in unchecked)


def test_torch_nn_attention_its_masks_and_its_own_decode_are_driven_as_torch_nn_takes_them():
    """Layers on nn.MultiheadAttention (its packed in_proj_weight as a fused W_Q, W_K, W_V), a model on
    nn.Transformer (post-norm stacks with a final norm each), torch.nn's masks, a beam search through
    the model's own decode(tgt, memory, tgt_mask), steered by hooks, and a training step handed a
    scheduler and a loss scaler."""
    result = check_file(str(WRITTEN["torchnn"] / "correct.py"), only=["encoder_layer", "beam_search", "train_step"])
    layer, beam, step = result.components
    assert layer.mapping[:4] == ["attn[0:16] -> W_Q", "attn[16:32] -> W_K", "attn[32:48] -> W_V",
                                 "attn.out_proj -> W_O"], format_report(result)
    assert beam.driven["en"].startswith("your own TranslationModel (it passed its check), through its own methods")
    notes = " ".join(n["en"] for n in step.notes)
    assert "LambdaLR whose factor is 1" in notes and "GradScaler" in notes and "float32" in notes


ZH_NAMES = '''
import torch.nn as nn
import torch.nn.functional as F


class 前馈网络(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.w_2(F.relu(self.w_1(x)))  # 先升维，再降回 d_model
'''


def test_a_class_named_in_chinese_is_found_by_its_name(tmp_path):
    path = tmp_path / "zh_names.py"
    path.write_text(ZH_NAMES)
    (comp,) = check_file(str(path)).components
    assert (comp.name, comp.kind, comp.status) == ("前馈网络", "ffn", "pass"), comp


def test_a_file_whose_top_level_cannot_run_has_its_definitions_graded_and_its_sizes_set():
    """Karpathy's lecture file reads input.txt and trains at module level: those statements are
    skipped and listed; its module-level n_embd, n_head, block_size are set for each check (and
    put back), and said so; heads kept as a list of single heads map to W_Q, W_K, W_V."""
    result = check_file(str(WRITTEN["karpathy"] / "correct.py"), only=["causal_attention", "generate"])
    assert any(s.startswith('line 22: with open("input.txt"') for s in result.skipped), result.skipped
    assert any("for it in range(max_iters)" in s and "the script's work" in s for s in result.skipped)
    mha, gen = result.components
    assert mha.mapping[:3] == ["heads[*].query -> W_Q", "heads[*].key -> W_K", "heads[*].value -> W_V"]
    assert any("n_embd=16" in n["en"] and "n_embd=128" in n["en"] for n in mha.notes)
    assert any("block_size=8" in n["en"] for n in gen.notes)  # the generate stand-in's block size
    zh = format_report(result, "zh")
    assert "没有运行的顶层语句" in zh and "the script's work" not in zh, zh
    assert '第 22 行：with open("input.txt", "r", encoding="utf-8") as f:（脚本要做的事，不是定义：没有运行）' in zh


@pytest.mark.parametrize("name", list(WRITTEN_PLANTS))
def test_a_planted_mistake_in_a_written_style_is_named(name):
    p = WRITTEN_PLANTS[name]
    assert written_file(name).read_text() == written_source(name)  # the fixture is the plant applied
    result = check_file(str(written_file(name)), only=[p.kind])
    named = {f.name for c in result.components for f in c.findings}
    assert p.diagnosis in named and exit_code(result) == 1, format_report(result)


def test_greedy_decoding_is_driven_through_the_learners_own_model_when_it_passed():
    """The tutorial's own model, with decode(tgt, memory, ...) in its own order, drives the learner's
    greedy decoding (a stand-in of another interface would refuse their call); EOS is steered
    through the model's output layer."""
    result = check_file(str(WRITTEN["carried"] / "correct.py"), only=["transformer", "greedy_decode"])
    model, greedy = result.components
    assert model.status == greedy.status == "pass", format_report(result)
    assert greedy.driven["en"].startswith("your own Transformer (it passed its check)")
    assert "调用方式：你自己的 Transformer" in format_report(result, "zh")


GREEDY_ONLY = '''
import torch


def greedy_decode(model, src, src_mask, max_len, start_symbol, end_symbol):
    memory = model.encode(src, src_mask)
    ys = torch.full((1, 1), start_symbol, dtype=src.dtype)
    for _ in range(max_len - 1):
        out = model.decode(ys, memory, src_mask, None)  # their own model's order, not the Annotated one
        next_word = model.fc_out(out[:, -1]).argmax(dim=-1).item()
        ys = torch.cat([ys, torch.full((1, 1), next_word, dtype=src.dtype)], dim=1)
        if next_word == end_symbol:
            break
    return ys
'''


def test_a_stand_ins_error_is_never_the_learners(tmp_path):
    """Without their model, the stand-in refuses their decode(ys, memory, ...) call: NOT CHECKED,
    with the adapter to write, exit code 3; never ERROR."""
    path = tmp_path / "greedy.py"
    path.write_text(GREEDY_ONLY)
    result = check_file(str(path))
    (comp,) = result.components
    assert comp.status == "not_checked" and comp.error.kind == "stand_in", format_report(result)
    assert comp.driven["en"].startswith("a stand-in")
    assert comp.adapter.startswith("def greedy_decode(model, src, src_mask, max_len, start_symbol, end_symbol):")
    assert exit_code(result) == 3
    report = format_report(result)
    assert "greedy_decode (greedy decoding (encoder-decoder)): NOT CHECKED" in report
    assert "why not checked (in forward)" in report and "1 not checked" in report
    assert json.loads(to_json(result))["components"][0]["status"] == "not_checked"
    assert "未检查" in format_report(result, "zh")


ODD_ATTENTION = '''
import math

import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self, breadth, heads):
        super().__init__()
        self.h, self.d = heads, breadth // heads
        self.q, self.k, self.v, self.o = (nn.Linear(heads * self.d, heads * self.d) for _ in range(4))

    def forward(self, q, k, v, mask=None):
        B = q.size(0)
        Q, K, V = (f(x).view(B, -1, self.h, self.d).transpose(1, 2) for f, x in ((self.q, q), (self.k, k), (self.v, v)))
        s = Q @ K.transpose(-2, -1) / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(mask == 0, -1e9)
        return self.o((s.softmax(-1) @ V).transpose(1, 2).reshape(B, -1, self.h * self.d))
'''


def test_the_adapters_file_builds_what_check_cannot_infer(tmp_path):
    """`breadth` is no name check knows, nor handed to a layer as its width (nn.Linear(breadth, ...)): NOT
    CHECKED with the adapter; the adapter (given with --adapters, found beside the file, or in the
    file with the handformer_ prefix) makes it PASS."""
    path = tmp_path / "odd.py"
    path.write_text(ODD_ATTENTION)
    (comp,) = check_file(str(path), {"mha": "Attn"}).components
    assert comp.status == "not_checked" and comp.adapter == (
        "def make_mha(n_heads):\n    return Attn(breadth=..., heads=n_heads)")
    adapter = "from odd import Attn\n\n\ndef make_mha(d_model, n_heads):\n    return Attn(d_model, n_heads)\n"
    (tmp_path / "mine.py").write_text(adapter)
    result = check_file(str(path), adapters=str(tmp_path / "mine.py"))
    assert [(c.name, c.kind, c.status) for c in result.components] == [("Attn", "mha", "pass")], format_report(result)
    (tmp_path / "handformer_adapters.py").write_text(adapter)
    assert [c.status for c in check_file(str(path)).components] == ["pass"]
    (tmp_path / "handformer_adapters.py").unlink()
    path.write_text(ODD_ATTENTION + "\n\ndef handformer_make_mha(d_model, n_heads):\n    return Attn(d_model, n_heads)\n")
    assert [c.status for c in check_file(str(path)).components] == ["pass"]


def test_a_whole_llama_is_compared_with_rotary_positions_grouped_query_attention_and_its_cache():
    """Meta's Transformer: interleaved rotary pairs at the base of its tables, 2 key/value heads, and
    start_pos: tokens 5..7 after 0..4 give the whole sequence's logits; the report says so in Chinese."""
    result = check_file(str(WRITTEN["llama"] / "correct.py"), only=["gpt"])
    (model,) = result.components
    assert model.status == "pass", format_report(result)
    assert "rotary positions (interleaved pairs, base 10000); grouped-query attention (4 heads, 2 key/value " \
           "heads)" in model.convention["en"]
    assert any("KV cache" in c.name["en"] and c.ok for c in model.checks)
    assert "因果性：改变位置 5 的 token，不影响位置 0..4 的 logits" in format_report(result, "zh")


def test_an_error_written_in_english_only_has_a_chinese_sentence_under_lang_zh():
    from handformer.check.core.report import format_error
    from handformer.check.core.result import LearnerError

    (line,) = format_error(LearnerError("mapping", "expected nn.Embedding(vocab_size=29, n_embd)", "__init__"), "zh")
    assert "检查程序没能把你的参数对应到 handformer 的参数上（原文：expected nn.Embedding" in line
    (line,) = format_error(LearnerError("exception", "ValueError: theirs", "forward"), "zh")
    assert line.endswith("ValueError: theirs")  # the learner's own exception keeps its text


def test_every_message_check_writes_itself_has_its_chinese():
    """Each `learner.fail(where, en, zh)`, DiscoveryError(en, zh=...) and MappingError(en, zh=...) in
    handformer/check passes a Chinese text, so that nothing check says is English only under --lang zh."""
    import ast

    missing = []
    for path in sorted((ROOT / "handformer" / "check").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name == "fail" and len(node.args) >= 2:
                zh = node.args[2] if len(node.args) > 2 else None
            elif name in ("DiscoveryError", "MappingError") and node.args:
                zh = next((k.value for k in node.keywords if k.arg == "zh"), None)
            else:
                continue
            if zh is None or not any("\u4e00" <= c <= "\u9fff" for c in ast.unparse(zh)):
                missing.append(f"{path.name}:{node.lineno}")
    assert not missing, missing


def test_a_component_check_cannot_build_is_said_in_chinese(tmp_path):
    path = tmp_path / "odd.py"
    path.write_text("import torch.nn as nn\n\n\nclass Attn(nn.Module):\n    def __init__(self, breadth, heads):\n"
                    "        super().__init__()\n\n    def forward(self, q, k, v, mask=None):\n        return q\n")
    result = check_file(str(path), overrides={"mha": "Attn"})
    zh = format_report(result, "zh")
    assert "填不了 Attn(breadth, heads) 的参数 'breadth'：handformer 认识这些名字" in zh, zh
    assert "cannot fill" not in zh


ONE_HEAD = '''
import torch
import torch.nn as nn


class CausalAttention(nn.Module):
    """One head of causal self-attention, as the book's chapter 3 builds it before the multi-head one."""

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        n = x.shape[1]
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        scores = q @ k.transpose(1, 2)
        scores = scores.masked_fill(self.mask.bool()[:n, :n], float("-inf"))
        weights = torch.softmax(scores{scale}, dim=-1)
        return self.dropout(weights) @ v
'''


def test_a_single_head_attention_is_compared_with_one_head_and_no_output_projection(tmp_path):
    """No number of heads and no W_O is one head, not a multi-head attention missing its projection;
    a mistake in it is still named."""
    right = tmp_path / "one_head.py"
    right.write_text(ONE_HEAD.replace("{scale}", " / k.shape[-1] ** 0.5"))
    (comp,) = check_file(str(right)).components
    assert (comp.kind, comp.status) == ("causal_attention", "pass"), format_report(check_file(str(right)))
    assert any(n["en"].startswith("one head") for n in comp.notes)
    wrong = tmp_path / "one_head_unscaled.py"
    wrong.write_text(ONE_HEAD.replace("{scale}", ""))
    (comp,) = check_file(str(wrong)).components
    assert comp.status == "fail" and [f.name for f in comp.findings] == ["no_scaling"]


def test_a_block_handed_a_mask_of_true_is_masked_and_rotary_tables_is_driven_so():
    """A Llama-style block (the book's later chapters) takes forward(x, mask, cos, sin), its mask bool
    with True = hidden: the convention is read from what the code fills, every step (the tutorial's
    shapes too) hands the mask so, and an attention handed (cos, sin) is searched with rotary inside
    whatever its helper is called."""
    result = check_file(str(WRITTEN["raschka"] / "llama_block.py"), only=["gqa", "block"])
    assert [(c.name, c.status) for c in result.components] == [
        ("GroupedQueryAttention", "pass"), ("TransformerBlock", "pass")], format_report(result)
    assert all(c.convention["en"].startswith("bool, True = masked") for c in result.components)


def test_a_bigram_generate_is_driven_through_its_own_model_and_needs_no_crop(tmp_path):
    """A bigram model has no position table: it runs on any context, so its generate, driven through
    the learner's own model (built although it has no blocks to compare), is not charged for feeding
    the whole context; the same loop that forgets to append the new token fails."""
    path = WRITTEN["karpathy"] / "bigram.py"
    (gen,) = check_file(str(path), only=["generate"]).components
    assert (gen.name, gen.status) == ("BigramLanguageModel.generate", "pass"), gen
    assert gen.driven["en"].startswith("your own BigramLanguageModel") and "no crop is needed" in gen.driven["en"]
    wrong = tmp_path / "bigram_not_appended.py"
    wrong.write_text(path.read_text().replace("idx = torch.cat((idx, idx_next), dim=1)", "idx_next = idx_next"))
    (gen,) = check_file(str(wrong), only=["generate"]).components
    assert gen.status == "fail" and "generate_not_appended" in {f.name for f in gen.findings}, gen


def test_a_schedule_that_reads_module_globals_is_driven_with_them_set():
    """nanoGPT's get_lr(it) reads warmup_iters, lr_decay_iters, learning_rate and min_lr as module
    globals: they are set to check's values for the check (and put back), and the report says so."""
    import sys

    result = check_file(str(WRITTEN["lmloop"] / "nanogpt_lr.py"))
    (comp,) = result.components
    assert (comp.name, comp.kind, comp.status) == ("get_lr", "schedule", "pass"), format_report(result)
    assert any("warmup_iters=10" in n["en"] and "warmup_iters=2000" in n["en"] for n in comp.notes)
    module = next(m for m in list(sys.modules.values()) if getattr(m, "__file__", "") == str(
        WRITTEN["lmloop"] / "nanogpt_lr.py"))
    assert module.warmup_iters == 2000  # put back


def test_a_cache_the_model_keeps_must_start_empty_for_each_prompt(tmp_path):
    """The KV cache kept inside the attention (use_cache=True, the LLM chapter's KV-cache variant):
    a loop that never calls reset_kv_cache() passes its first run and fails the second, with its own
    exception from the position table (the cache still holds the first prompt)."""
    path = tmp_path / "no_reset.py"
    path.write_text((WRITTEN["kvcache"] / "correct.py").read_text().replace("        model.reset_kv_cache()\n", ""))
    (comp,) = check_file(str(path), only=["generate"]).components
    first, again = (c for c in comp.checks if "each step's logits" not in c.name["en"])
    assert comp.status == "fail" and first.ok and not again.ok, format_report(check_file(str(path), only=["generate"]))
    assert "again (the cache your model keeps must start empty)" in again.name["en"] and "IndexError" in again.detail["en"]


OWN_CACHE_LOOP = """
import torch


class KVCache:
    def __init__(self, n_layers):
        self.layers = [None] * n_layers


def generate(model, idx, max_new_tokens, context_size=None):
    model.eval()
    context_size = context_size or model.cfg["context_length"]
    cache = KVCache(n_layers=model.cfg["n_layers"])
    logits = model(idx[:, -context_size:], cache=cache)
    for _ in range(max_new_tokens):
        nxt = logits[:, -1].argmax(dim=-1, keepdim=True)
        idx = torch.cat([idx, nxt], dim=1)
        logits = model(nxt, cache=cache)
    return idx
"""


def test_a_loop_the_stand_in_cannot_serve_is_not_checked_never_an_error(tmp_path):
    """A generate without its model in the file, which reads model.cfg and hands the model a cache
    object of its own: the stand-in cannot serve it (an attribute it has not, a cache it cannot
    fill), so NOT CHECKED with the adapter, never an error of theirs; model.eval() on the stand-in runs."""
    path = tmp_path / "loop.py"
    path.write_text(OWN_CACHE_LOOP)
    for source in (OWN_CACHE_LOOP, OWN_CACHE_LOOP.replace('model.cfg["context_length"]', "8").replace(
            'model.cfg["n_layers"]', "2")):
        path.write_text(source)
        (comp,) = check_file(str(path)).components
        assert comp.status == "not_checked" and comp.error.kind == "stand_in", format_report(check_file(str(path)))
        assert comp.adapter.endswith("from loop import generate as yours\n    return yours(model, idx, "
                                     "max_new_tokens)  # your function, called as check calls it")


QK_NORM = '''
import math

import torch
import torch.nn as nn


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class QKNormAttention(nn.Module):
    """Grouped-query attention with each query and key head RMS-normed before its rotary positions."""

    def __init__(self, d_model, n_heads, n_kv_heads, theta=10000.0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=1e-6)
        self.register_buffer("inv_freq", theta ** (-torch.arange(0, self.head_dim, 2).float() / self.head_dim))

    def rotary(self, x):
        angles = torch.arange(x.shape[2]).float()[:, None] * self.inv_freq  # (T, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)
        return x * angles.cos() + rotate_half(x) * angles.sin()

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
{norm_then_rotate}        k = k.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        v = v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))
'''
NORM_THEN_ROTATE = ("        q, k = self.q_norm(q), self.k_norm(k)\n"
                    "        q, k = self.rotary(q), self.rotary(k)\n")


def test_an_attention_with_qk_norm_is_compared_with_handformers_qk_norm(tmp_path):
    """q_norm and k_norm of width head_dim (Qwen3's QK-norm) are the reference's q/k norms, not
    parameters it lacks; normed after the rotation fails, named; norms as wide as all the heads (OLMo 2's,
    k_norm as wide as the key heads) are compared before the split."""
    path = tmp_path / "qk_norm.py"
    path.write_text(QK_NORM.replace("{norm_then_rotate}", NORM_THEN_ROTATE))
    (comp,) = check_file(str(path)).components
    assert (comp.kind, comp.status) == ("gqa", "pass"), format_report(check_file(str(path)))
    assert comp.mapping[-2:] == ["q_norm -> q_norm", "k_norm -> k_norm"]
    rotate_then_norm = "".join(reversed(NORM_THEN_ROTATE.splitlines(keepends=True)))
    path.write_text(QK_NORM.replace("{norm_then_rotate}", rotate_then_norm))
    (comp,) = check_file(str(path)).components
    assert comp.status == "fail" and [f.name for f in comp.findings] == ["qk_norm_after_rope"], comp.findings
    assert any(not ch.ok and ch.name["en"].startswith("matches handformer's") for ch in comp.checks)
    whole = QK_NORM.replace("{norm_then_rotate}", NORM_THEN_ROTATE.splitlines(keepends=True)[1])
    for name, width in (("q", "d_model"), ("k", "n_kv_heads * self.head_dim")):  # OLMo 2's: before the split
        whole = whole.replace(f"{name}_norm = nn.RMSNorm(self.head_dim", f"{name}_norm = nn.RMSNorm({width}")
        whole = whole.replace(f"self.{name}_proj(x).view", f"self.{name}_norm(self.{name}_proj(x)).view")
    path.write_text(whole)
    (comp,) = check_file(str(path)).components  # k_norm as wide as the key heads (8): compared so
    assert comp.status == "pass" and comp.mapping[-2:] == ["q_norm -> q_norm", "k_norm -> k_norm"], (
        format_report(check_file(str(path))))


def test_a_start_pos_given_one_a_batch_row_is_handed_so(tmp_path):
    """Raschka's batched KV cache: an attention and a block whose start_pos is a (B,) tensor, one start
    a row, refuse the int 0 and are handed torch.zeros(B); both are then compared and pass."""
    source = (WRITTEN["llama"] / "correct.py").read_text()
    source = source.replace("        bsz, seqlen, _ = x.shape\n        xq, xk, xv",
                            "        bsz, seqlen, _ = x.shape\n        start_pos = int(start_pos[0])  # one a row\n"
                            "        xq, xk, xv", 1)
    source = source.replace("h = layer(h, start_pos, freqs_cis, mask)",
                            "h = layer(h, torch.full((tokens.shape[0],), start_pos), freqs_cis, mask)")
    assert source.count("one a row") == 1 and "torch.full((tokens" in source
    path = tmp_path / "per_row_start.py"
    path.write_text(source)
    result = check_file(str(path), only=["gqa", "block"])
    status = {c.name: c.status for c in result.components}
    assert status["Attention"] == status["TransformerBlock"] == "pass", format_report(result)


def test_a_block_with_qk_norm_and_a_method_generate_on_past_key_values_are_checked():
    """minimind's newer style: the attention's q_norm and k_norm are its QK-norm slots, not the
    block's norms; the block's optional attention_mask (padding) is left out where the block is
    causal without it; generate is a method that calls self.forward with past_key_values, driven
    through the learner's own model (a stand-in has no cache of that shape), with its EOS and top-k
    defaults set for a small vocabulary."""
    result = check_file(str(FAMILIES["minimind_qk"] / "correct.py"), only=["block", "gpt", "generate"])
    assert [(c.name, c.status) for c in result.components] == [
        ("MiniMindBlock", "pass"), ("MiniMindForCausalLM", "pass"), ("MiniMindForCausalLM.generate", "pass")], \
        format_report(result)
    block, _, gen = result.components
    assert "self_attn.q_norm -> q_norm" in block.mapping
    assert gen.driven["en"].startswith("your own MiniMindForCausalLM")
    assert any("eos_token_id=-1" in n["en"] and "top_k=24" in n["en"] for n in gen.notes)


def test_an_engine_class_generate_is_driven_through_the_model_it_holds():
    """Meta's `Llama(model: Transformer, tokenizer).generate(prompt_tokens, max_gen_len)`: built with
    the learner's own Transformer (start_pos and its cache inside) and a stand-in tokenizer; a loop
    that hands start_pos 0 with each new token is named."""
    result = check_file(str(WRITTEN["llamagen"] / "correct.py"), only=["generate"])
    (gen,) = result.components
    assert gen.status == "pass", format_report(result)
    assert gen.driven["en"].startswith("your own Transformer in your Llama")
    planted = check_file(str(written_file("llamagen_start_pos_zero")), only=["generate"])
    assert [f.name for c in planted.components for f in c.findings] == ["generate_cache_mismatch"], \
        format_report(planted)


def test_a_device_named_cuda_runs_on_the_cpu():
    """A file that names the device (`torch.full(..., device="cuda")`, Meta's generate) runs on a
    machine without CUDA: the device is read as the CPU."""
    import torch

    from handformer.check.core.cpu_only import NAMES_CUDA, CudaAsCpu

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: nothing to stand in for")
    assert NAMES_CUDA.search('tokens = torch.full((2, 3), -1, device="cuda")')
    with CudaAsCpu():
        ids = torch.full((2, 3), -1, dtype=torch.long, device="cuda").to("cuda")
    assert ids.device.type == "cpu"


NUCLEUS_WITH_DEFAULT = '''
import torch
import torch.nn.functional as F


def top_p_sample(logits, p=0.9, temperature=1.0):
    probs = F.softmax(logits / temperature, dim=-1)
    sorted_probs, idx = probs.sort(dim=-1, descending=True)
    keep = sorted_probs.cumsum(dim=-1) - sorted_probs < p
    sorted_probs = sorted_probs * keep
    sorted_probs = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return idx.gather(-1, torch.multinomial(sorted_probs, 1))
'''

ONE_TOKEN_AT_A_TIME = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, vocab_size, d_model):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d_model)
        self.out = nn.Linear(d_model, vocab_size)

    def forward(self, tokens, start_pos):
        assert tokens.shape[1] == 1, "Only one token at a time can be processed"
        return self.out(self.emb(tokens))
'''


def test_a_filtering_default_is_off_for_the_plain_draws_and_an_assert_on_the_input_is_not_theirs(tmp_path):
    """top_p_sample(logits, p=0.9): its plain and temperature draws are taken with p=1 (its default
    filters), so a correct nucleus sampler passes. A model whose own assert refuses a whole sequence
    (Umar Jamil's Llama decodes one token at a time) is driven one token at a time, never their
    ERROR; this one has no blocks nor attention: a toy that drives a loop, a DRIVER."""
    sampler = tmp_path / "nucleus.py"
    sampler.write_text(NUCLEUS_WITH_DEFAULT)
    (sample,) = check_file(str(sampler), only=["sample"]).components
    assert sample.status == "pass", sample.checks
    model = tmp_path / "one_token.py"
    model.write_text(ONE_TOKEN_AT_A_TIME)
    result = check_file(str(model), overrides={"gpt": "Model"}, only=["gpt"])
    (gpt,) = result.components
    assert gpt.status == "driver" and gpt.error is None, format_report(result)
    assert all(c.ok for c in gpt.checks) and len(gpt.checks) == 3, format_report(result)  # shape, causality


D2L_LENS = ROOT / "tests" / "fixtures" / "learners_d2l_lens"


def test_a_decoder_and_a_model_handed_the_source_lengths_as_arguments_pass():
    """DecoderLayer.forward(x, memory, src_lens) builds its causal lengths itself and
    Seq2Seq.forward(src, tgt, src_lens) takes the source's lengths: both built, driven and passed;
    a causal length off by one is named at the line that builds it."""
    result = check_file(str(D2L_LENS / "correct.py"), only=["decoder_layer", "transformer"])
    assert [(c.name, c.status) for c in result.components] == [("DecoderLayer", "pass"), ("Seq2Seq", "pass")], \
        format_report(result)
    planted = check_file(str(D2L_LENS / "causal_no_self.py"), only=["decoder_layer"])
    assert [(f.name, f.line) for f in planted.components[0].findings] == [("causal_off_by_one", 62)], \
        format_report(planted)


STATIC = Path(__file__).parent / "fixtures" / "learners_static" / "batch_masks.py"


@pytest.mark.parametrize(("old", "new"), [(None, None), ("return keep & subsequent_mask", "return keep | subsequent_mask")])
def test_a_static_method_is_graded_as_its_kind(tmp_path, old, new):
    """The Annotated Transformer's Batch.make_std_mask, a static method, is the mask helper it is
    named for: right as written; its mask joined with | instead of & fails at that line."""
    from check_plants import edited_copy

    path = edited_copy(tmp_path, STATIC, [(old, new)]) if old else str(STATIC)
    result = check_file(path, only=["mask_helper"])
    found = {c.name: c for c in result.components}
    assert list(found) == ["Batch.make_std_mask"], format_report(result)
    helper = found["Batch.make_std_mask"]
    assert helper.status == ("fail" if old else "pass"), format_report(result)
    if old:
        assert [(f.name, f.code) for f in helper.findings][0][0] == "mask_combined_with_or", format_report(result)
        assert new in helper.findings[0].code, format_report(result)


@pytest.mark.parametrize(("old", "new"), [(None, None), ("self.tgt_y = tgt[:, 1:]", "self.tgt_y = tgt[:, :-1]")])
def test_a_batch_whose_labels_are_not_moved_on_fails_at_that_line(tmp_path, old, new):
    """The Batch's labels tgt_y are the target one position on (tgt[:, 1:]); set to the decoder's
    input tgt[:, :-1], the labels are not shifted: train_step_no_shift at that line."""
    from check_plants import edited_copy

    path = edited_copy(tmp_path, STATIC, [(old, new)]) if old else str(STATIC)
    result = check_file(path, only=["batch_masks"])
    batch = {c.name: c for c in result.components}["Batch"]
    assert batch.status == ("fail" if old else "pass"), format_report(result)
    assert [(f.name, f.code) for f in batch.findings] == ([("train_step_no_shift", new)] if old else []), (
        format_report(result))


def test_a_generation_method_beside_generate_is_graded_too(tmp_path):
    """A model's `generate_cached` method beside the file's own loop: a generation loop, graded."""
    from check_plants import edited_copy

    kv = Path(__file__).parent / "fixtures" / "learners_kvcache" / "correct.py"
    method = ("    def reset_kv_cache(self):",
              "    def generate_cached(self, idx, max_new_tokens):\n"
              "        return generate_cached(self, idx, max_new_tokens)\n\n    def reset_kv_cache(self):")
    result = check_file(edited_copy(tmp_path, kv, [method]), only=["generate"])
    assert {c.name: c.status for c in result.components}.get("GPTModel.generate_cached") == "pass", \
        format_report(result)
