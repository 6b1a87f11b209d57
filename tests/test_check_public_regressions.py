"""Forms of public code that a grader change once broke, each in a few lines of a learner's file:
nanochat's module namespace holding functools.partial (a class with no signature) beside a plain
config class; an MoE layer that check's sizes build with fewer experts than its top-k (Raschka's
Qwen3 dict config, num_experts = 0 for its model's one FFN); gpt-fast's
apply_rope_scaling(freqs, rope_scaling=None) that reads its settings from a dict; the Annotated
Transformer's `viz_encoder_self()`, which unpacks a pair from a function of its file but takes no model
or optimizer, so is no training step."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.engine import check_file, import_learner
from handformer.check.core.report import format_report

PARTIAL_CONFIG = '''
from functools import partial

import torch
import torch.nn as nn


class Config:
    def __init__(self, n_embd=16, n_head=4):
        self.n_embd = n_embd
        self.n_head = n_head


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.act = partial(torch.nn.functional.gelu, approximate="none")

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))
'''

DICT_MOE = '''
import torch
import torch.nn as nn


class MoEFeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_experts_per_tok = cfg["num_experts_per_tok"]
        self.gate = nn.Linear(cfg["emb_dim"], cfg["num_experts"], bias=False)
        self.experts = nn.ModuleList([nn.Linear(cfg["emb_dim"], cfg["emb_dim"]) for _ in range(cfg["num_experts"])])

    def forward(self, x):
        scores = torch.softmax(self.gate(x), dim=-1)
        weights, chosen = scores.topk(self.num_experts_per_tok, dim=-1)
        outs = torch.stack([e(x) for e in self.experts], dim=-2)
        picked = outs.gather(-2, chosen[..., None].expand(*chosen.shape, outs.size(-1)))
        return (weights[..., None] * picked).sum(-2)
'''

ROPE_SCALING = '''
import math
from typing import Optional

import torch


def apply_rope_scaling(freqs: torch.Tensor, rope_scaling: Optional[dict] = None):
    factor = rope_scaling["factor"]
    low_freq_factor = rope_scaling["low_freq_factor"]
    high_freq_factor = rope_scaling["high_freq_factor"]
    old_context_len = rope_scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new_freqs = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new_freqs.append(freq)
        elif wavelen > low_freq_wavelen:
            new_freqs.append(freq / factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new_freqs.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(new_freqs, dtype=freqs.dtype, device=freqs.device)
'''


def _checked(tmp: Path, name: str, source: str, kind: str):
    path = tmp / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    return check_file(str(path), only=[kind])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("public_forms")
    scaled_wrong = ROPE_SCALING.replace("new_freqs.append(freq / factor)", "new_freqs.append(freq * factor)")
    return {"partial": _checked(tmp, "partial_config", PARTIAL_CONFIG, "ffn"),
            "moe": _checked(tmp, "dict_moe", DICT_MOE, "moe"),
            "scaling": _checked(tmp, "rope_scaling", ROPE_SCALING, "rope_scaling"),
            "scaling_wrong": _checked(tmp, "rope_scaling_wrong", scaled_wrong, "rope_scaling")}


def test_a_plain_config_class_is_read_beside_an_imported_class_with_no_signature(results):
    (mlp,) = results["partial"].components
    assert mlp.status == "pass", format_report(results["partial"])


def test_an_moe_built_with_fewer_experts_than_its_top_k_is_not_checked_never_failed(results):
    (moe,) = results["moe"].components
    assert moe.status == "not_checked", format_report(results["moe"])
    assert "experts for a top-2" in moe.error.message and "专家" in moe.error.message_zh


def test_a_rope_scaling_that_reads_a_dict_is_handed_meta_settings(results):
    (ok,) = results["scaling"].components
    (wrong,) = results["scaling_wrong"].components
    assert ok.status == "pass", format_report(results["scaling"])
    assert wrong.status == "fail", format_report(results["scaling_wrong"])


DRAWN_PAIR = '''
def run_model_example():
    return "model", "data"


def get_batch(split):
    return "x", "y"


def viz_encoder_self():
    model, example_data = run_model_example()
    return model


def train_step(model, optimizer):
    xb, yb = get_batch("train")
    return model, optimizer, xb, yb
'''


def test_a_function_that_unpacks_a_pair_from_its_file_is_a_step_only_when_it_takes_model_and_optimizer(tmp_path):
    from handformer.check.core.signatures import lm_step

    path = tmp_path / "drawn_pair.py"
    path.write_text(DRAWN_PAIR, encoding="utf-8")
    module = import_learner(str(path))
    assert lm_step(module.train_step) and not lm_step(module.viz_encoder_self)
