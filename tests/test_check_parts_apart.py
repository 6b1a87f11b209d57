"""Layers and blocks whose parts check used to leave NOT CHECKED, in a style of their own
(fixtures/learners_parts_apart/lecture_parts.py, verified against torch.nn's encoder and decoder
layers and against transformers' apply_rotary_pos_emb with F.scaled_dot_product_attention): a width
given as `input_dim` and an FFN multiplier no name says (`expand * input_dim`), a layer whose forward
takes the attention's inputs apart (query, key, value, mask), a decoder layer handed its target mask
alone, a block whose residual its file adds in a wrapper (Skip(Block(...))) with one projection fused
across attention and FFN, a rotary table of angles and an apply function of (freqs, t)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy
from torch import nn

from handformer.check.core.discovery import argument_keys
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_parts_apart"
KINDS = ["mha", "rope", "encoder_layer", "decoder_layer", "block"]


@pytest.fixture(scope="module")
def correct():
    return check_file(str(HERE / "lecture_parts.py"), only=KINDS)


def test_every_part_is_built_driven_and_passes(correct):
    report = format_report(correct)
    assert {c.name: (c.kind, c.status) for c in correct.components} == {
        "HeadsAttention": ("mha", "pass"), "apply_rotary_emb": ("rope", "pass"),
        "AngleRotaryEmbedding": ("rope", "pass"), "SublayerBlock": ("encoder_layer", "pass"),
        "CaptionDecoderLayer": ("decoder_layer", "pass"), "FusedParallelBlock": ("block", "pass")}, report
    assert "checked as your file uses it, inside Skip" in report, report
    # q, k, v; gate and up, 2 x 4 x d_model rows (the FFN multiplier check builds with is 4)
    assert "proj_in[0:24][0:16] -> W_Q" in report and "proj_in[24:152]" in report, report


PLANTS = {  # (the edit, the kind, the finding's name, the line quoted)
    "ffn_reads_the_query": (("        return self.n2(x + self.drop(self.ffn(x)))",
                             "        return self.n2(x + self.drop(self.ffn(query)))"), "encoder_layer",
                            "departs", "line 47: return self.n2(x + self.drop(self.ffn(query)))"),
    "no_scaling": (("        scores = q @ k.unsqueeze(1).transpose(-2, -1) / math.sqrt(q.size(-1))",
                    "        scores = q @ k.unsqueeze(1).transpose(-2, -1)"), "block", "no_scaling",
                   "line 118: scores = q @ k.unsqueeze(1).transpose(-2, -1)"),
    "rope_rotation_sign": (("    return torch.cat((-x2, x1), dim=-1)", "    return torch.cat((x2, -x1), dim=-1)"),
                           "rope", "rope_rotation_sign", "line 91: return torch.cat((x2, -x1), dim=-1)"),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_line_fails_where_it_is(tmp_path, plant):
    edit, kind, name, line = PLANTS[plant]
    result = check_file(edited_copy(tmp_path, HERE / "lecture_parts.py", [edit]), only=[kind])
    report = format_report(result)
    failed = [c for c in result.components if c.status == "fail"]
    assert failed and name in [f.name for c in failed for f in c.findings], report
    assert line in report, report


def test_a_width_named_as_an_input_is_a_vocabulary_where_an_embedding_takes_it():
    """bentrevett's Encoder(input_dim, hid_dim, ...) embeds input_dim tokens; UvA's
    EncoderBlock(input_dim, ...) takes input_dim features; a multiplier no name says is one by what
    the constructor builds with it."""

    class Encoder(nn.Module):
        def __init__(self, input_dim, hid_dim, n_heads, widen):
            super().__init__()
            self.embed = nn.Embedding(input_dim, hid_dim)
            self.up = nn.Linear(hid_dim, widen * hid_dim)

    class Block(nn.Module):
        def __init__(self, input_dim, n_heads):
            super().__init__()
            self.proj = nn.Linear(input_dim, input_dim)

    assert argument_keys(Encoder) == {"input_dim": "src_vocab", "hid_dim": "d_model", "n_heads": "n_heads",
                                      "widen": "ffn_mult"}
    assert argument_keys(Block) == {"input_dim": "d_model", "n_heads": "n_heads"}


TABLE_OF_SIN_AND_COS = '''import torch


def rotary_table(seq_len, dim, base=10000.0):
    inv = base ** (-torch.arange(0, dim, 2).float() / dim)
    ang = torch.arange(seq_len).float()[:, None] * inv[None, :]  # (T, dim/2)
    return torch.cat([ang.cos(), ang.sin()], dim=-1)  # (T, dim): the cosines, then the sines


def apply_rotary(x, pos_emb):
    half = pos_emb.shape[-1] // 2
    cos = pos_emb[..., :half].repeat_interleave(2, dim=-1)
    sin = pos_emb[..., half:].repeat_interleave(2, dim=-1)
    turned = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape(x.shape)
    return x * cos + turned * sin
'''


def test_a_table_argument_check_only_guessed_is_not_checked_never_failed(tmp_path):
    """An apply function whose table (its name says angles to check) holds the cosines then the sines,
    a layout check does not try: no guess matches a rotation, so the function is NOT CHECKED with the
    adapter to write, never FAILed (correct code)."""
    path = tmp_path / "sin_cos_table.py"
    path.write_text(TABLE_OF_SIN_AND_COS)
    result = check_file(str(path), only=["rope"])
    report = format_report(result)
    assert {c.name: c.status for c in result.components}.get("apply_rotary") == "not_checked", report
    assert "write an adapter" in report, report
