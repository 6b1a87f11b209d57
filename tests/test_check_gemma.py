"""`handformer check` on a Gemma-like model and a Llama-chat-like block, each rule with a correct file
that passes and a planted one that fails: GeGLU with the tanh GELU compared as such (the erf GELU in a
Gemma model's MLP named), RMSNorm with gain 1 + weight inside blocks and models, token embeddings times
sqrt(d_model) read from what the first block is handed, the learner's `.float()` kept in float64, a
model's `generate` driven through that model, a norm that as built outputs the same for any input,
grouped-query attention built with 2 key/value heads of 4 (a tiled repeat shows), a block handed a
cache argument driven on the whole sequence, and a model's cached decoding through the cache its own
method makes (the line where the cached path parts quoted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
HERE = Path(__file__).parent / "fixtures" / "learners_gemma"


def _planted(tmp_path: Path, name: str, old: str, new: str) -> str:
    return edited_copy(tmp_path, HERE / name, [(old, new)])


def test_the_gemma_like_model_passes_with_its_conventions():
    result = check_file(str(HERE / "correct.py"), only=["ffn", "rmsnorm", "block", "gpt", "generate"])
    status = {c.name: c.status for c in result.components}
    assert status == {"GemmaMLP": "pass", "RMSNorm": "differs", "DecoderBlock": "pass",
                      "GemmaForCausalLM": "pass", "GemmaForCausalLM.generate": "pass"}, format_report(result)
    block, model, generate = result.components[2:]
    assert any("1 + weight" in n["en"] for n in block.notes) and any("1 + weight" in n["en"] for n in model.notes)
    assert "token embeddings times sqrt(d_model)" in model.convention["en"]
    assert "your own GemmaForCausalLM" in generate.driven["en"]


PLANTS = {  # kind: (the planted edit, a finding named or None, words of the report)
    "ffn": (('F.gelu(self.gate_proj(x), approximate="tanh")', "F.gelu(self.gate_proj(x))"),
            "ffn_wrong_activation", "Gemma's MLP uses the tanh GELU"),
    "gpt": (("self.embed_tokens(idx) * math.sqrt(self.cfg.d_model)", "self.embed_tokens(idx) * self.cfg.d_model"),
            None, "times a constant factor"),
    "rmsnorm": (("(h * (1.0 + self.weight.float()))", "(h * self.weight.float())"),
                None, "line 33 multiplies by it: return (h * self.weight.float()).type_as(x)"),
    "causal_attention": (("k = k.repeat_interleave(self.h // self.kv, dim=1)", "k = k.repeat(1, self.h // self.kv, 1, 1)"),
                         None, "line 78: k = k.repeat(1, self.h // self.kv, 1, 1)"),
}


@pytest.mark.parametrize("kind", list(PLANTS))
def test_each_gemma_plant_fails(tmp_path, kind):
    (old, new), named, words = PLANTS[kind]
    result = check_file(_planted(tmp_path, "correct.py", old, new), only=[kind])
    (comp,) = result.components
    report = format_report(result)
    assert comp.status == "fail" and [f.name for f in comp.named()] == ([named] if named else []), report
    assert words in report, report


def test_a_block_handed_a_cache_argument_is_driven_whole(tmp_path):
    (block,) = check_file(str(HERE / "chat_block.py"), only=["block"]).components
    assert block.status == "pass" and not any("one token at a time" in n["en"] for n in block.notes)
    planted = _planted(tmp_path, "chat_block.py", ".tril(diagonal=start_pos)", ".tril(diagonal=start_pos + 1)")
    (block,) = check_file(planted, only=["block"]).components
    assert block.status == "fail"


CACHE_PLANTS = {  # (the planted edit, the line quoted)
    "correct": (("", ""), None),
    "mask_not_offset": ((".tril(diagonal=start_pos)", ".tril()"), "keep = torch.ones(T, S, dtype=torch.bool).tril()"),
    "keys_as_values": (("self.v[layer][:, :, start_pos:end] = v", "self.v[layer][:, :, start_pos:end] = k"),
                       "self.v[layer][:, :, start_pos:end] = k (in a helper called from line"),
}


@pytest.mark.parametrize("plant", list(CACHE_PLANTS))
def test_a_model_decoding_through_its_own_cache_parts_where_its_line_does(tmp_path, plant):
    (old, new), quoted = CACHE_PLANTS[plant]
    (model,) = check_file(_planted(tmp_path, "chat_block.py", old, new), only=["gpt"]).components
    cached = next(c for c in model.checks if c.name["en"].startswith("through its cache (new_cache)"))
    assert cached.ok == (quoted is None) and model.status == ("pass" if quoted is None else "fail")
    assert quoted is None or any(quoted in f.observed["en"] for f in model.findings), model.findings


def test_the_attention_cap_of_a_model_is_read_from_the_setting_named_for_it():
    """Gemma 2's attention soft cap inside a model (the reference model caps its scores with it): the
    number a setting named for a cap holds, read where the attention's forward calls tanh; the head
    count and head width it also reads are no cap."""
    import torch
    from torch import nn

    from handformer.check.runners.attention import attention_cap

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.num_heads, self.head_dim, self.attn_logit_softcapping = 4, 16, 50.0

        def forward(self, scores):
            scores = scores / self.head_dim ** 0.5 / self.num_heads
            return torch.tanh(scores / self.attn_logit_softcapping) * self.attn_logit_softcapping

    model = nn.Sequential(Attention())
    assert attention_cap(model) == 50.0
    model[0].attn_logit_softcapping = None  # no cap: none read
    assert attention_cap(model) is None


CAPPED = [("    eps: float = 1e-6\n", "    eps: float = 1e-6\n    attn_logit_softcapping: float = {cap}\n"),
          ("        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.dh)\n",
           "        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.dh)\n"
           "        att = torch.tanh(att / self.cfg.attn_logit_softcapping) * self.cfg.attn_logit_softcapping\n"),
          ("        self.h, self.kv = cfg.n_heads, cfg.num_key_value_heads\n",
           "        self.h, self.kv = cfg.n_heads, cfg.num_key_value_heads\n        self.cfg = cfg\n")]


@pytest.mark.parametrize("cap", [2.0, 50.0])
def test_a_model_whose_attention_soft_caps_its_scores_passes(tmp_path, cap):
    """The reference model caps its scores as the learner's does, and computes its softmax and norms
    in float64 as check's float64 run does (float32 there parted from theirs by 1e-6, a false FAIL)."""
    edits = [(old, new.format(cap=cap)) for old, new in CAPPED]
    (model,) = check_file(edited_copy(tmp_path, HERE / "correct.py", edits), only=["gpt"]).components
    assert model.status == "pass" and model.max_abs_error < 1e-6, model.checks
