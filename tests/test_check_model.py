"""`handformer check` on the assembled models: the encoder-decoder Transformer against handformer's
Seq2SeqTransformer on the learner's weights, its choices reported as choices (each planted mistake
is named in tests/test_check.py)."""

from __future__ import annotations

import json

import pytest
from check_plants import correct_file

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report, to_json

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_assembled_model_passes_against_seq2seq_transformer():
    result = check_file(str(correct_file("model")), only=["transformer"])
    (comp,) = result.components
    assert comp.status == "pass" and comp.max_abs_error < 1e-9, format_report(result)
    assert comp.mapping[:2] == ["src_embed.lut -> source embedding", "tgt_embed.lut -> target embedding"]
    assert "encoder_norm -> encoder final norm" in comp.mapping and "out -> output layer" in comp.mapping
    assert comp.convention["en"] == ("embeddings scaled by sqrt(d_model); output layer separate, with a bias; "
                                     "pre-norm layers; sinusoidal positions; forward returns logits")
    assert "嵌入乘以 sqrt(d_model)" in comp.convention["zh"]
    zh = format_report(result, "zh")  # handformer's side of the mapping in Chinese, the learner's names kept
    assert "src_embed.lut -> 源端嵌入" in zh and "encoder_norm -> 编码器最后的归一化层" in zh, zh
    assert exit_code(result) == 0


CHOICES = [("self.scale = math.sqrt(d_model)", "self.scale = 1.0"),
           ("        self.out = nn.Linear(d_model, tgt_vocab)\n",
            "        self.out = nn.Linear(d_model, tgt_vocab, bias=False)\n"
            "        self.out.weight = self.tgt_embed.lut.weight\n"),
           ("return self.out(self.decode(memory, src_mask, tgt, tgt_mask))",
            "return F.log_softmax(self.out(self.decode(memory, src_mask, tgt, tgt_mask)), dim=-1)")]


def test_unscaled_tied_embeddings_without_bias_and_log_probabilities_are_choices(tmp_path):
    source = correct_file("model").read_text()
    for old, new in CHOICES:
        assert old in source
        source = source.replace(old, new)
    path = tmp_path / "choices.py"
    path.write_text(source)
    result = check_file(str(path), only=["transformer"])
    (comp,) = result.components
    assert comp.status == "pass" and not comp.findings, format_report(result)
    assert comp.convention["en"] == ("embeddings not scaled; output layer tied to the target embedding, no bias; "
                                     "pre-norm layers; sinusoidal positions; forward returns log-probabilities")
    assert "out -> output layer (tied to the target embedding)" in comp.mapping


def test_an_output_layer_defined_but_the_target_embedding_used_is_reported_as_tied(tmp_path):
    source = correct_file("model").read_text().replace(
        "return self.out(self.decode(memory, src_mask, tgt, tgt_mask))",
        "return self.decode(memory, src_mask, tgt, tgt_mask) @ self.tgt_embed.lut.weight.T")
    path = tmp_path / "tied.py"
    path.write_text(source)
    (comp,) = check_file(str(path), only=["transformer"]).components
    assert comp.status == "pass" and "output layer tied to the target embedding, no bias" in comp.convention["en"]


def test_a_planted_model_mistake_in_json_and_a_model_that_exits_is_an_error(tmp_path):
    source = correct_file("model").read_text()
    path = tmp_path / "model.py"
    path.write_text(source.replace("x = self.pos(self.src_embed(src))", "x = self.src_embed(src)"))
    data = json.loads(to_json(check_file(str(path), only=["transformer"])))
    (comp,) = data["components"]
    assert comp["status"] == "fail" and [f["name"] for f in comp["findings"]] == ["pe_missing"]
    assert comp["findings"][0]["form"] == "src"
    path.write_text(source.replace("        memory = self.encode(src, src_mask)\n",
                                   "        import sys\n        sys.exit(3)\n"))
    (comp,) = check_file(str(path), only=["transformer"]).components
    assert comp.status == "fail" and "sys.exit(3)" in comp.error.message
    path.write_text(source.replace("return self.out(self.decode(", "return float('nan') * self.out(self.decode("))
    (comp,) = check_file(str(path), only=["transformer"]).components
    assert comp.status == "fail" and [f.name for f in comp.findings] == ["unlocated"], comp  # at its class line


class _Context:
    """What the steered model needs of a check's context: a way to call (here: handformer's) code."""

    def __init__(self) -> None:
        from handformer.check.core.fingerprint import Learner

        self.learner = Learner("handformer")


def test_the_beam_reference_is_handformers_beam_search():
    """check/beam.py's reference follows handformer.generation.decoding.beam_search: both give the
    same best hypothesis on every scenario of the steered model."""
    import torch
    from torch import nn

    from handformer.check.runners.beam import (
        BOS,
        EOS,
        MAX_LEN,
        PAD,
        SCENARIOS,
        HandformerModel,
        Steered,
        reference,
    )
    from handformer.generation.decoding import DecodeLimits, beam_search

    base, src = HandformerModel(), torch.tensor([[5, 7, 9, 11, 3, 6]])
    for table in SCENARIOS.values():
        steered = Steered(base, table, _Context())

        class Adapter(nn.Module):  # handformer's call convention on the steered model
            cfg = base.inner.cfg

            def encode(self, src):
                return base.inner.encode(src)

            def decode(self, ys, memory, src_mask, cache=None, steered=steered):
                return steered.decode(memory, None, ys, None), None, None

            def generator(self, h, steered=steered):
                return steered.generator(h)

        limits = DecodeLimits(BOS, EOS, PAD, max_len_a=0, max_len_b=MAX_LEN - 1)
        (theirs,) = beam_search(Adapter(), src, limits, beam_size=2, length_penalty=1.0, use_cache=False)
        memory = base.encode(src)
        ours = reference(steered, memory, 2, MAX_LEN - 1, 1.0, "eos")
        assert ours[1:] == theirs and ours[-1] == EOS
        assert reference(steered, memory, 2, MAX_LEN - 1, 1.0, "eos") is ours  # searched once a model


def test_beam_search_without_a_transformer_of_its_own_runs_on_handformers_model(tmp_path):
    source = correct_file("model").read_text()
    path = tmp_path / "beam.py"
    path.write_text("import torch\nimport torch.nn.functional as F\n\n\n" + source[source.index("def beam_search("):])
    result = check_file(str(path))
    comp, batched = result.components
    assert [c.kind for c in result.components] == ["beam_search"] * 2, format_report(result)
    assert comp.status == batched.status == "pass", format_report(result)
    assert comp.driven["en"].startswith("a stand-in: handformer's tiny Seq2SeqTransformer")
    assert any("does not take a batch" in n["en"] for n in comp.notes)
    assert batched.checks[-1].name["en"].startswith("a batch of 2 sentences gives what each gives alone")
    assert comp.convention["en"] == "score / length^alpha; the length counts the new tokens and EOS"
    comp, _ = check_file(str(correct_file("model")), only=["beam_search"]).components
    assert comp.status == "pass" and comp.driven["en"].startswith("your own Transformer"), comp.driven
    path.write_text(source.replace("finished.append((score / (len(tokens) - 1) ** alpha, tokens))",
                                   "finished.append((score / (len(tokens) - 2) ** alpha, tokens))"))
    comp, _ = check_file(str(path), only=["beam_search"]).components
    assert comp.status == "pass" and not comp.findings, format_report(check_file(str(path), only=["beam_search"]))
    assert comp.convention["en"] == "score / length^alpha; the length counts the new tokens without EOS"
    path.write_text(source.replace("finished.append((score / (len(tokens) - 1) ** alpha, tokens))",
                                   "finished.append((score / len(tokens) ** alpha, tokens))"))
    comp, _ = check_file(str(path), only=["beam_search"]).components
    assert comp.status == "pass" and comp.convention["en"].endswith("every token, BOS and EOS included")


def test_the_gpt_passes_against_causal_lm_and_its_inference_forward_is_compared_at_the_last_position(tmp_path):
    result = check_file(str(correct_file("gpt")), only=["gpt"])
    (comp,) = result.components
    assert comp.status == "pass" and comp.max_abs_error < 1e-9, format_report(result)
    assert comp.mapping[-1] == "lm_head -> output head"
    assert comp.convention["en"] == "output head separate; pre-norm blocks; gelu FFN; learned positions"
    assert "built with config.tie_weights = False" in [n["en"] for n in comp.notes]
    names = [c.name["en"] for c in comp.checks]
    assert {"the loss equals the cross-entropy of handformer's logits",
            "causality: changing token 5 leaves logits 0..4 unchanged"} <= set(names), names
    source = correct_file("gpt").read_text()
    path = tmp_path / "gpt.py"
    path.write_text(source.replace("def forward(self, idx, targets=None):",
                                   "def forward(self, idx):\n        targets = None").replace(
        "        if config.tie_weights:\n            self.transformer.wte.weight = self.lm_head.weight\n",
        "        self.transformer.wte.weight = self.lm_head.weight  # nanoGPT's: always tied\n").replace(
        "    tie_weights: bool = True  # the output head shares the token embedding's matrix\n", "").replace(
        "nn.GELU()", "nn.GELU(approximate='tanh')"))
    result = check_file(str(path), only=["gpt"])
    (comp,) = result.components
    assert comp.status == "pass", format_report(result)
    assert comp.convention["en"].startswith("output head tied to the token embedding; pre-norm blocks; gelu_tanh FFN")
    assert comp.mapping[-1] == "lm_head -> output head (tied to the token embedding)"
    assert any("last position's logits only" in n["en"] for n in comp.notes)


def test_a_gpt_of_rmsnorm_and_swiglu_blocks_without_biases_passes(tmp_path):
    """The LLM chapter's choices in nanoGPT's GPT: the reference takes the learner's norm (RMSNorm
    here, by what it computes) and gated FFN, so a correct model of them passes."""
    source = correct_file("gpt").read_text()
    source = source.replace("        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None\n",
                            "        self.eps = 1e-6\n").replace(
        "        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)",
        "        return input * torch.rsqrt(input.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight")
    source = source.replace("class LayerNorm(nn.Module):", "class RMSNorm(nn.Module):").replace(
        "LayerNorm(config.n_embd", "RMSNorm(config.n_embd").replace("bias: bool = True", "bias: bool = False")
    source = source.replace(
        "        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)\n        self.gelu = nn.GELU()\n",
        "        self.w1 = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)\n"
        "        self.w3 = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)\n").replace(
        "return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))",
        "return self.dropout(self.c_proj(F.silu(self.w1(x)) * self.w3(x)))")
    assert "F.silu(self.w1(x))" in source and "class RMSNorm" in source and "self.eps" in source
    path = tmp_path / "gpt_rms.py"
    path.write_text(source)
    result = check_file(str(path), only=["gpt"])
    (comp,) = result.components
    assert comp.status == "pass" and comp.max_abs_error < 1e-9, format_report(result)


ANNOTATED_MODEL = '''
import copy
import math

import torch
import torch.nn as nn


def clones(module, n):
    return nn.ModuleList([copy.deepcopy(module) for _ in range(n)])


def attention(query, key, value, mask=None, dropout=None):
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    weights = scores.softmax(dim=-1)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask=None):
        if mask is not None:
            mask = mask.unsqueeze(1)
        n = query.size(0)
        q, k, v = [lin(x).view(n, -1, self.h, self.d_k).transpose(1, 2)
                   for lin, x in zip(self.linears, (query, key, value))]
        x, _ = attention(q, k, v, mask, self.dropout)
        return self.linears[3](x.transpose(1, 2).contiguous().view(n, -1, self.h * self.d_k))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.1):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(self.w_1(x).relu()))


class LayerNorm(nn.Module):
    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.a_2, self.b_2, self.eps = nn.Parameter(torch.ones(features)), nn.Parameter(torch.zeros(features)), eps

    def forward(self, x):
        return self.a_2 * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    def __init__(self, size, dropout):
        super().__init__()
        self.norm, self.dropout = LayerNorm(size), nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


class EncoderLayer(nn.Module):
    def __init__(self, size, self_attn, feed_forward, dropout):
        super().__init__()
        self.self_attn, self.feed_forward, self.size = self_attn, feed_forward, size
        self.sublayer = clones(SublayerConnection(size, dropout), 2)

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class DecoderLayer(nn.Module):
    def __init__(self, size, self_attn, src_attn, feed_forward, dropout):
        super().__init__()
        self.self_attn, self.src_attn, self.feed_forward, self.size = self_attn, src_attn, feed_forward, size
        self.sublayer = clones(SublayerConnection(size, dropout), 3)

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))
        x = self.sublayer[1](x, lambda x: self.src_attn(x, memory, memory, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class Encoder(nn.Module):
    def __init__(self, layer, N):
        super().__init__()
        self.layers, self.norm = clones(layer, N), LayerNorm(layer.size)

    def forward(self, x, mask):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class Decoder(nn.Module):
    def __init__(self, layer, N):
        super().__init__()
        self.layers, self.norm = clones(layer, N), LayerNorm(layer.size)

    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


class Embeddings(nn.Module):
    def __init__(self, d_model, vocab):
        super().__init__()
        self.lut, self.d_model = nn.Embedding(vocab, d_model), d_model

    def forward(self, x):
        return self.lut(x) * math.sqrt(self.d_model)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout, max_len=5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)].requires_grad_(False))


class Generator(nn.Module):
    def __init__(self, d_model, vocab):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x):
        return self.proj(x).log_softmax(dim=-1)


class EncoderDecoder(nn.Module):
    def __init__(self, encoder, decoder, src_embed, tgt_embed, generator):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.src_embed, self.tgt_embed, self.generator = src_embed, tgt_embed, generator

    def forward(self, src, tgt, src_mask, tgt_mask):
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src, src_mask):
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory, src_mask, tgt, tgt_mask):
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)


def make_model(src_vocab, tgt_vocab, N=6, d_model=512, d_ff=2048, h=8, dropout=0.1):
    c = copy.deepcopy
    attn = MultiHeadedAttention(h, d_model)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout)
    position = PositionalEncoding(d_model, dropout)
    return EncoderDecoder(Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout), N),
                          Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout), N),
                          nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
                          nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)), Generator(d_model, tgt_vocab))
'''


def test_the_annotated_transformers_model_is_built_by_make_model_and_compared(tmp_path):
    """EncoderDecoder(encoder, decoder, src_embed, tgt_embed, generator) built by make_model, rank-3
    masks, a forward that returns the decoder's states (the generator's log-probabilities are
    compared), and its LayerNorm over the unbiased std compared as it computes (named on the
    LayerNorm itself)."""
    path = tmp_path / "annotated.py"
    path.write_text(ANNOTATED_MODEL)
    result = check_file(str(path), only=["transformer", "layernorm"])
    status = {c.name: (c.status, sorted(f.name for f in c.findings)) for c in result.components}
    assert status == {"LayerNorm": ("fail", ["layernorm_unbiased_std"]), "EncoderDecoder": ("pass", [])}, (
        format_report(result))
    model = next(c for c in result.components if c.kind == "transformer")
    assert any("make_model" in n["en"] for n in model.notes)
    assert model.convention["en"] == ("embeddings scaled by sqrt(d_model); output layer separate, with a bias; "
                                      "pre-norm layers; sinusoidal positions; forward returns log-probabilities")
    path.write_text(ANNOTATED_MODEL.replace("return self.norm(x)\n\n\nclass Decoder", "return x\n\n\nclass Decoder"))
    (model,) = check_file(str(path), only=["transformer"]).components
    assert [(f.name, f.form) for f in model.findings] == [("final_norm_missing", "encoder")], model.notes


def test_the_new_kinds_are_pointed_at_other_names_with_component(tmp_path):
    from handformer.cli.check import parse_components

    path = tmp_path / "lm.py"
    path.write_text(correct_file("gpt").read_text().replace("class GPT(nn.Module):", "class TinyLM(nn.Module):"))
    overrides, only = parse_components(["gpt=TinyLM"])  # --component gpt=TinyLM
    result = check_file(str(path), overrides, only)  # in-process: the command line's child is tests/test_check.py's
    data = json.loads(to_json(result))
    assert exit_code(result) == 0 and [(c["name"], c["kind"], c["status"]) for c in data["components"]] == [
        ("TinyLM", "gpt", "pass")]
    source = correct_file("model").read_text()
    path = tmp_path / "search.py"
    path.write_text(source.replace("def beam_search(", "def search(").replace("return [beam_search(", "return [search("))
    result = check_file(str(path), overrides={"beam_search": "search"}, only=["beam_search"])
    assert [(c.name, c.status) for c in result.components] == [("search", "pass")], format_report(result)


SIDED = correct_file("model").parents[1] / "learners_s2s_epoch" / "learned_positions.py"
SIDED_PLANTS = {
    "correct": None,
    "embedding_scale_unused": ("x = self.dropout(self.token_emb(src) * self.emb_scale + self.position_emb(positions))",
                               "x = self.dropout(self.token_emb(src) + self.position_emb(positions))"),
    "pe_missing": ("y = self.dropout(self.token_emb(trg) * self.emb_scale + self.position_emb(positions))",
                   "y = self.dropout(self.token_emb(trg) * self.emb_scale)")}


@pytest.fixture(scope="module")
def sided(tmp_path_factory):
    from check_plants import edited_copy

    paths = {name: edited_copy(tmp_path_factory.mktemp(name), SIDED, [edit]) if edit else str(SIDED)
             for name, edit in SIDED_PLANTS.items()}
    return {name: check_file(path, only=["transformer"]) for name, path in paths.items()}


def test_a_model_whose_encoder_and_decoder_each_learn_positions_is_compared(sided):
    (comp,) = sided["correct"].components
    assert comp.status == "pass" and comp.max_abs_error < 1e-9, format_report(sided["correct"])
    assert "decoder.position_emb -> target learned positions" in comp.mapping
    assert "decoder.position_emb -> 目标端可学习的位置编码" in format_report(sided["correct"], "zh")


@pytest.mark.parametrize("plant", ["embedding_scale_unused", "pe_missing"])
def test_one_sides_embedding_plant_fails_named_at_its_line(sided, plant):
    (comp,) = sided[plant].components
    assert comp.status == "fail", format_report(sided[plant])
    assert [(f.name, f.code) for f in comp.findings] == [(plant, SIDED_PLANTS[plant][1].strip())], (
        format_report(sided[plant]))
