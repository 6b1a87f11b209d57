"""Components check builds from what the code does, each with a plant of ours that fails and its correct
twin that passes: a Chinese course's MultiHeadedAttention(head, embedding_dim), an encoder-decoder whose
forward takes the target with its mask, OLMo's norm with no parameters, its rotary module returning the
rotated (q, k), and its SwiGLU module with no parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.discovery import decoder_only
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FIXTURES = Path(__file__).parent / "fixtures"
COURSE = FIXTURES / "learners_course_zh" / "correct.py"
OLMO = FIXTURES / "learners_olmo" / "correct.py"


_planted = edited_copy


@pytest.mark.parametrize("planted", [False, True])
def test_an_attention_built_with_head_and_embedding_dim(tmp_path, planted):
    """`head` is the number of heads; a plant that fills masked scores with 0 fails."""
    edits = [("masked_fill(mask == 0, -1e9)", "masked_fill(mask == 0, 0)")] if planted else []
    result = check_file(_planted(tmp_path, COURSE, edits), only=["mha"])
    (mha,) = result.components
    assert mha.status == ("fail" if planted else "pass"), format_report(result)


def test_a_target_with_its_own_mask_is_the_decoders_input_not_labels():
    class EncoderDecoder:
        def forward(self, source, target, source_mask, target_mask): ...

    class GPT:
        def forward(self, idx, targets=None): ...

    class LM:
        def forward(self, input_ids, target): ...

    assert not decoder_only(EncoderDecoder) and decoder_only(GPT) and decoder_only(LM)


OLMO_PLANTS = {  # kind -> (the name checked, the plant's edit)
    "layernorm": ("LayerNorm", ("return (x - mean) / torch.sqrt", "return x / torch.sqrt")),
    "rope": ("RotaryEmbedding", ("torch.cat((-t2, t1)", "torch.cat((t2, -t1)")),
    "ffn": ("SwiGLU", ("F.silu(gate) * up", "F.silu(gate) + up")),
}


@pytest.mark.parametrize("planted", [False, True])
def test_olmo_pieces_without_parameters_are_built_and_checked(tmp_path, planted):
    edits = [edit for _, edit in OLMO_PLANTS.values()] if planted else []
    result = check_file(_planted(tmp_path, OLMO, edits), only=list(OLMO_PLANTS))
    got = {c.name: c.status for c in result.components}
    want = "fail" if planted else "pass"
    assert got == {name: want for name, _ in OLMO_PLANTS.values()}, format_report(result)


@pytest.mark.parametrize("planted", [False, True])
def test_a_model_found_by_what_it_builds_with_fused_gate_and_up(tmp_path, planted):
    """OLMo: a model of no known name found by its embedding and list of blocks; its blocks' ff_proj
    holds up and gate (the half the code names gate is the gate); a plant without the final norm fails
    quoting the line that applies the head."""
    edits = [("F.linear(self.ln_f(x), self.wte.weight)", "F.linear(x, self.wte.weight)")] if planted else []
    result = check_file(_planted(tmp_path, OLMO, edits), only=["block", "gpt"])
    got = {c.name: c.status for c in result.components}
    assert got == {"Block": "pass", "OLMo": "fail" if planted else "pass"}, format_report(result)
    if planted:
        (finding,) = result.components[-1].findings
        assert (finding.name, finding.code.strip()) == ("final_norm_missing", "return F.linear(x, self.wte.weight)")


TORCH_LAYERS = FIXTURES / "learners_torch_layers" / "correct.py"
TORCH_PLANTS = {  # kind -> (the name checked, a plant)
    "transformer": ("TranslationModel", ("src_key_padding_mask=~src_mask[:, 0])", "src_key_padding_mask=src_mask[:, 0])")),
    "greedy_decode": ("greedy_decode", ("out[:, -1]).argmax", "out[:, 0]).argmax")),
    "train_step": ("train_step", (" / (tgt_y != PAD).sum()", " / tgt_y.numel()")),
}


@pytest.mark.parametrize("planted", [False, True])
def test_a_model_on_torch_layers_that_takes_keep_masks(tmp_path, planted):
    """A model on torch.nn's layers whose forward takes the tutorials' keep-masks is driven with them,
    its greedy decoding is handed the same source mask, and a step that divides a summed loss by the
    real tokens is compared with handformer's step divided so; each plant fails."""
    edits = [edit for _, edit in TORCH_PLANTS.values()] if planted else []
    result = check_file(_planted(tmp_path, TORCH_LAYERS, edits), only=[*TORCH_PLANTS, "loss"])
    got = {c.name: c.status for c in result.components}
    want = "fail" if planted else "pass"
    assert got == {"LabelSmoothing": "pass"} | {name: want for name, _ in TORCH_PLANTS.values()}, \
        format_report(result)


PHI_ROTARY = '''import torch
import torch.nn as nn


class PhiRotaryEmbedding(nn.Module):
    def __init__(self, rotary_dim, max_position_embeddings=2048, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, seq_len):
        emb = torch.outer(torch.arange(seq_len, dtype=self.inv_freq.dtype), self.inv_freq)
        emb = torch.cat((emb, emb), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)
'''


@pytest.mark.parametrize("planted", [False, True])
def test_a_rotary_table_built_with_the_width_it_turns(tmp_path, planted):
    """Phi's PhiRotaryEmbedding(rotary_dim, ...): rotary_dim is the width of the table."""
    path = tmp_path / "phi_rotary.py"
    path.write_text(PHI_ROTARY.replace("emb.sin()", "(-emb).sin()") if planted else PHI_ROTARY, encoding="utf-8")
    result = check_file(str(path), only=["rope"])
    (rope,) = result.components
    assert rope.status == ("fail" if planted else "pass"), format_report(result)


PARTIAL = '''import math
import torch
import torch.nn as nn


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class PhiAttention(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.rotary_ndims = int(self.head_dim * 0.4) // 2 * 2  # 0 of 4, 2 of 8
        self.q_proj, self.k_proj = nn.Linear(hidden_size, hidden_size), nn.Linear(hidden_size, hidden_size)
        self.v_proj, self.dense = nn.Linear(hidden_size, hidden_size), nn.Linear(hidden_size, hidden_size)

    def rotary(self, t):
        r, T = self.rotary_ndims, t.size(2)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, r, 2).double() / r))
        emb = torch.outer(torch.arange(T).double(), inv_freq).repeat(1, 2).to(t.dtype)  # (T, r)
        turned, kept = t[..., :r], t[..., r:]
        return torch.cat((turned * emb.cos() + rotate_half(turned) * emb.sin(), kept), dim=-1)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (p(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = self.rotary(q), self.rotary(k)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        att = att.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
        return self.dense((att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))
'''


@pytest.mark.parametrize("planted", [False, True])
def test_partial_rotary_is_a_convention_read_from_what_the_code_turns(tmp_path, planted):
    """Phi's attention turns 0.4 of each head (none of 4 dims, 2 of 8): compared so at 2 heads of 8; a
    plant that turns each pair the other way fails."""
    path = tmp_path / "phi_attention.py"
    plant = ("+ rotate_half(turned) * emb.sin()", "- rotate_half(turned) * emb.sin()")
    path.write_text(PARTIAL.replace(*plant) if planted else PARTIAL, encoding="utf-8")
    result = check_file(str(path), only=["causal_attention"])
    (attention,) = result.components
    assert attention.status == ("fail" if planted else "pass"), format_report(result)
