"""`handformer check` on three Hugging Face families whose correct code once failed: Command-R's
(interleaved rotary pairs in (cos, sin) tables the attention is handed, one norm feeding attention and
MLP side by side), first-generation Qwen's (a fused c_attn, rotary tables (1, T, 1, Dh) handed as
rotary_pos_emb, an MLP gated by w2) and MiniCPM's (μP scales read from the config: residual
scale_depth / sqrt(layers), logits over hidden_size / dim_model_base; a WSD schedule whose decay halves
above the floor; a training step that hands its schedule **sched). Each correct file passes whole; a
plant in each fails at its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"
COHERE = FIXTURES / "learners_cohere_interleaved" / "command_r.py"
QWEN = FIXTURES / "learners_qwen1" / "qwen_first.py"
MINICPM = FIXTURES / "learners_minicpm" / "mup_minicpm.py"


@pytest.fixture(scope="module", params=[(COHERE, 6), (QWEN, 8), (MINICPM, 7)], ids=lambda p: p[0].stem)
def correct(request):
    path, count = request.param
    return check_file(str(path)), count


def test_each_correct_family_file_passes_whole(correct):
    result, count = correct
    assert [c.status for c in result.components] == ["pass"] * count, format_report(result)


def test_minicpm_scales_are_read_from_its_settings():
    result = check_file(str(MINICPM), only=["gpt"])
    said = result.components[0].convention["en"]
    for scale in ("each sublayer's output times 0.848528", "token embeddings times 8", "logits times 0.5"):
        assert scale in said, said


PLANTS = [
    # Command-R: eps outside the root of the norm the block builds (no norm component of its own)
    (COHERE, "        return self.weight * (centred * torch.rsqrt(variance + self.variance_epsilon))",
     "        return self.weight * (centred / (torch.sqrt(variance) + self.variance_epsilon))",
     "block", "norm_eps_outside_sqrt"),
    # a table laid out in halves where the rotation pairs interleaved dimensions
    (COHERE, "        angles = torch.stack([angles, angles], dim=-1).flatten(-2)",
     "        angles = torch.cat([angles, angles], dim=-1)", "rope", "departs"),
    # Qwen: silu on w1, the linear branch of Qwen's checkpoints
    (QWEN, "        return self.c_proj(self.w1(x) * F.silu(self.w2(x)))",
     "        return self.c_proj(F.silu(self.w1(x)) * self.w2(x))", "ffn", "gated_activation_wrong_branch"),
    (QWEN, "        q, k, v = self.c_attn(hidden_states).split(C, dim=2)",
     "        q, v, k = self.c_attn(hidden_states).split(C, dim=2)", "causal_attention", "kv_swapped"),
    # MiniCPM: the MLP's branch added unscaled; the μP ratio inverted; clipping after the update
    (MINICPM, "        x = x + self.mlp(self.post_attention_layernorm(x)) * branch",
     "        x = x + self.mlp(self.post_attention_layernorm(x))", "block", "departs"),
    (MINICPM, "        x = self.norm(x) / (self.cfg.hidden_size / self.cfg.dim_model_base)",
     "        x = self.norm(x) / (self.cfg.dim_model_base / self.cfg.hidden_size)", "gpt", "departs"),
    (MINICPM, "    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)\n    optimizer.step()",
     "    optimizer.step()\n    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)", "lm_train_step",
     "train_step_clip_after_step"),
]


@pytest.mark.parametrize(("path", "old", "new", "kind", "name"), PLANTS,
                         ids=[f"{p[0].stem}-{p[4]}-{i}" for i, p in enumerate(PLANTS)])
def test_each_family_plant_fails_at_its_line(tmp_path, path, old, new, kind, name):
    result = check_file(edited_copy(tmp_path, path, [(old, new)]), only=[kind])
    report = format_report(result)
    failed = [c for c in result.components if c.status == "fail"]
    findings = [f for c in failed for f in c.findings]
    assert failed and name in {f.name for f in findings}, report
    planted = next(line for line in new.splitlines() if "clip" in line or len(new.splitlines()) == 1).strip()
    assert any(planted in (f.code or "") for f in findings), report
