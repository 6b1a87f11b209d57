"""`handformer check` on the 2025-26 model families as learners copy them, each a correct file that
passes with every component checked and planted ones that fail quoting the planted line:

- Gemma 3 (Hugging Face's modeling file): QK-norm with Gemma's gain 1 + weight, four norms a block
  (the "sandwich": before and after each sublayer) in blocks and models;
- gpt-oss (OpenAI's model.py, batched): attention sinks (a learned logit a head joined to each softmax),
  a sliding window on every other layer, norms and residuals inside AttentionBlock and MLPBlock, a
  RotaryEmbedding module reading (B, T, H, Dh);
- DeepSeek-V3 (DeepSeek's model.py): multi-head latent attention (wq_a, q_norm, wq_b, wkv_a, kv_norm,
  wkv_b), alone, in blocks and in models, and precompute_freqs_cis(args)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report
from handformer.check.reference import variants as V
from handformer.check.runners.latent import LatentWeights, latent_attention
from handformer.config import CausalLMConfig, MLAConfig
from handformer.families.deepseek import LatentAttention
from handformer.nn.positions import RotaryEmbedding

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
FAMILIES = {"gemma3": "learners_gemma3", "gpt_oss": "learners_gpt_oss", "deepseek": "learners_deepseek"}
EXPECTED = {  # each family's components: all checked, all passing (Gemma's RMSNorm differs by design)
    "gemma3": {"Gemma3Attention": "pass", "repeat_kv": "pass", "apply_rotary_pos_emb": "pass",
               "Gemma3RotaryEmbedding": "pass", "Gemma3MLP": "pass", "Gemma3RMSNorm": "differs",
               "Gemma3DecoderLayer": "pass", "Gemma3ForCausalLM": "pass"},
    "gpt_oss": {"RotaryEmbedding": "pass", "RMSNorm": "pass", "TransformerBlock": "pass", "Transformer": "pass"},
    "deepseek": {"MLA": "pass", "apply_rotary_emb": "pass", "precompute_freqs_cis": "pass", "MLP": "pass",
                 "RMSNorm": "pass", "Block": "pass", "Transformer": "pass"},
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def correct(request):
    return request.param, check_file(str(FIXTURES / FAMILIES[request.param] / "correct.py"))


def test_each_correct_file_passes_with_every_component_checked(correct):
    family, result = correct
    assert {c.name: c.status for c in result.components} == EXPECTED[family], format_report(result)
    assert exit_code(result) == 0


def test_what_each_correct_file_is_compared_as(correct):
    family, result = correct
    by = {c.name: c for c in result.components}
    report = format_report(result)
    words = {"gemma3": ["post_feedforward_layernorm -> norm 4 (after FFN)", "sandwich-norm blocks",
                        "q_norm -> q_norm"],
             "gpt_oss": ["attn.sinks -> sinks", "a sliding window on blocks [0]", "inputs (B, T, H, Dh)"],
             "deepseek": ["wkv_a -> W_DKV", "layers.1 -> block 1",
                          "RoPE pairs (2j, 2j+1), interleaved"]}[family]
    assert all(w in report for w in words), report
    assert not any(c.findings for c in by.values())


# planted mistakes beside tests/check_plants.py's (each catalogued one of these families is there, run by
# tests/test_check.py): name -> (family, kind checked, edits, the finding named (None: where it departs),
# the planted line quoted)
PLANTS = {
    "keys_through_q_norm": (
        "gemma3", "gqa", [("key_states = self.k_norm(key_states)", "key_states = self.q_norm(key_states)")],
        None, "key_states = self.q_norm(key_states)"),
    "window_off_by_one": (
        "gpt_oss", "block", [("diagonal=-sliding_window)", "diagonal=-sliding_window - 1)")],
        None, "diagonal=-sliding_window - 1)"),
    "latent_key_not_rotated_in_the_model": (
        "deepseek", "gpt", [("k_pe = apply_rotary_emb(k_pe.unsqueeze(2), freqs_cis)", "k_pe = k_pe.unsqueeze(2)")],
        "latent_key_not_rotated", "k_pe = k_pe.unsqueeze(2)"),
}


@pytest.mark.parametrize("name", list(PLANTS))
def test_each_plant_fails_quoting_its_line(tmp_path, name):
    family, kind, edits, named, line = PLANTS[name]
    path = edited_copy(tmp_path, FIXTURES / FAMILIES[family] / "correct.py", edits)
    result = check_file(path, only=[kind])
    (comp,) = [c for c in result.components if c.status != "pass"]  # (gqa: repeat_kv passes beside it)
    report = format_report(result)
    assert comp.status == "fail" and exit_code(result) == 1, report
    assert [f.name for f in comp.findings if f.name != "departs"] == ([named] if named else []), report
    assert any(line in (f.code or "") for f in comp.findings), report


@pytest.mark.parametrize("interleave", [True, False])
def test_the_latent_reference_is_handformers_latent_attention(interleave):
    """check's latent attention computes what handformer's LatentAttention computes, RoPE pairs either way."""
    torch.manual_seed(0)
    cfg = CausalLMConfig.llama_style(vocab_size=16, d_model=16, n_heads=4, d_ff=32, n_layers=1, head_dim=4,
                                     mla=MLAConfig(kv_rank=16, q_rank=24, nope_dim=8, v_dim=8,
                                                   interleave=interleave))
    hf = LatentAttention(cfg).double().eval()
    for p in hf.parameters():
        torch.nn.init.normal_(p, 1.0 if p.dim() == 1 else 0.0, 0.3)
    lin = lambda m: (m.weight, None)  # noqa: E731
    w = LatentWeights((lin(hf.q_a_proj), V.NormWeights(hf.q_a_norm.weight, None, hf.q_a_norm.eps, "rmsnorm"),
                       lin(hf.q_b_proj)), lin(hf.kv_a_proj),
                      V.NormWeights(hf.kv_a_norm.weight, None, hf.kv_a_norm.eps, "rmsnorm"), lin(hf.kv_b_proj),
                      lin(hf.o_proj), (16, 8, 4, 8))
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    keep = torch.ones(5, 5, dtype=torch.bool).tril()
    rope = RotaryEmbedding(4, 64).double()(torch.arange(5)[None])
    want = hf(x, keep[None, None], rope=rope)[0]
    got = latent_attention(w, x, keep, "interleaved" if interleave else "half")
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)  # (handformer's rotary tables: float32 angles)
