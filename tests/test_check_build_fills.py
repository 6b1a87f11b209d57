"""How `build` fills a constructor's arguments (discovery.FILLS, the first row that holds): a switch
built on, a size by its name, a config read by its fields, a fixed value, T5's relative table, an
argument a host hands, a default kept (a rotary share at check's), a choice its type says, the learner's
own part, and a DiscoveryError naming the argument where none holds. No check is run."""

from __future__ import annotations

import pytest

from handformer.check.core.discovery import DiscoveryError, _build_matched, build

SIZES = {"d_model": 16, "n_heads": 4, "d_ff": 40, "dropout": 0.0, "max_len": 64}


class Everything:
    def __init__(self, n_heads, config, layer_idx, quant: bool, self_attn, q_proj, glu=False,
                 has_relative_attention_bias=False, capacity_factor=1.25, rotary_pct=0.25, depth_scale=3.0):
        self.got = {k: v for k, v in locals().items() if k not in ("self", "config")}
        self.width = config.n_embd


def test_each_argument_is_filled_by_its_row():
    built = _build_matched(Everything, {**SIZES, "switched": "glu"}, {"mha": lambda: "own attention"},
                           {"q_proj": "handed projection"})
    assert built.width == 16  # config.n_embd, read from a config namespace
    assert built.got == {"n_heads": 4, "layer_idx": 0, "quant": False, "self_attn": "own attention",
                         "q_proj": "handed projection", "glu": True, "has_relative_attention_bias": True,
                         "capacity_factor": 16.0, "rotary_pct": 0.5, "depth_scale": 3.0}


class Unfillable:
    def __init__(self, d_model, wobble):
        self.d_model = d_model


def test_an_argument_no_row_fills_is_a_discovery_error_naming_it():
    with pytest.raises(DiscoveryError, match="cannot fill the argument 'wobble' of Unfillable"):
        build(Unfillable, SIZES)
