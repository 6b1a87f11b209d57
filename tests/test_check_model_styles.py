"""Whole models in styles whose blocks `handformer check` checked while it left the model NOT CHECKED,
each beside a plant that must still fail:

- lucidrains' PaLM: each parallel block (attention and SwiGLU from one fused projection,
  multi-query) inside a Residual wrapper in the model's layer list, `num_tokens` for the vocabulary,
  and `F.normalize(x) * sqrt(d) * g` norms, which add no eps.

And ChatGLM's attention and block, which check could not build or drive: `(config, layer_number)`,
Megatron's config names (kv_channels, multi_query_group_num, ffn_hidden_size), the stream
sequence-first, the rotary cache handed in as `rotary_pos_emb` (T, Dh/2, 2) real (cos, sin) pairs,
which must come in the stream's dtype; its apply function `apply_rotary_pos_emb(x, rope_cache)` takes
queries sequence-first, (T, B, H, Dh).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from check_results import checked, component, named, statuses

from handformer.check.core.context import forward_parameters
from handformer.check.core.report import format_report
from handformer.check.core.rope_tables import renamed_table

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def palm():
    return checked("learners_palm_model")


def test_palm_model_of_wrapped_parallel_blocks_is_compared(palm):
    assert statuses(palm) == {"RMSNorm": "pass", "ParallelBlock": "pass", "PaLM": "pass"}, format_report(palm)
    assert "layers.0 -> block 0" in component(palm, "PaLM").mapping
    assert "parallel blocks" in component(palm, "PaLM").convention["en"]


def test_palm_model_plant_fails_at_the_line_that_applies_its_head():
    planted = checked("learners_palm_model", "no_final_norm", only=["gpt"])
    assert named(planted, "PaLM") == [("final_norm_missing", "return self.to_logits(x)")], format_report(planted)


@pytest.fixture(scope="module")
def glm():
    return checked("learners_glm_block")


def test_chatglm_attention_and_block_handed_their_rotary_cache_are_compared(glm):
    assert statuses(glm) == {"SelfAttention": "pass", "apply_rotary_pos_emb": "pass", "MLP": "pass",
                             "RMSNorm": "pass", "GLMBlock": "pass"}, format_report(glm)
    assert "sequence-first" in " ".join(n["en"] for n in component(glm, "GLMBlock").notes)
    assert "inputs sequence-first (T, B, H, Dh)" in " ".join(
        n["en"] for n in component(glm, "apply_rotary_pos_emb").notes)


def test_chatglm_plant_fails_at_its_score_scale():
    planted = checked("learners_glm_block", "scaled_by_dk", only=["gqa", "block"])
    for name in ("SelfAttention", "GLMBlock"):
        assert [code for _, code in named(planted, name)] == ["scores = q @ k.transpose(-1, -2) / self.hn"], (
            format_report(planted))


def test_rotary_pos_emb_is_a_table_unless_the_file_unpacks_it_as_a_pair():
    glm = load_fixture("learners_glm_block", "correct")
    qwen = load_fixture("learners_glm_block", "qwen_pair")
    _, params = renamed_table(glm.SelfAttention.forward, forward_parameters(glm.SelfAttention.forward))
    assert "freqs_cis" in [p.name for p in params]
    _, params = renamed_table(qwen.rotated, forward_parameters(qwen.rotated))
    assert [p.name for p in params] == ["hidden_states", "position_embeddings"]  # Hugging Face's (cos, sin) name


def load_fixture(folder: str, name: str):
    spec = importlib.util.spec_from_file_location(f"learner_{name}", FIXTURES / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
