"""The static decoding step (handformer/inference/static_step.py) computes the eager step's tokens.

- Run uncompiled (torch.compile replaced by the function itself), the static step, through the
  engine that `generate` drives, gives the eager greedy and seeded sampled tokens for each family it serves
  (learned positions and biases, RoPE with grouped heads, q/k norms, Gemma 2's soft-caps and
  sandwich norms without a window), for one row, equal-length rows (static) and padded rows
  (eager fallback), over a capacity bucket: the fixed shapes, index writes, the mask over
  every column and the zeroed empty columns are all exercised without compile time.
- The families it does not serve (a sliding window, a mixture of experts, LongRoPE) decode
  eagerly when compiling is asked for, with eager's tokens, and `eager_reason` names why.
- Compiled by Inductor once (one tiny model, one row), the tokens are eager's and the compile
  seconds are recorded.
"""

import pytest
import torch

from handformer.config import CausalLMConfig, LongRopeScaling, MoEConfig
from handformer.families import build_causal_lm
from handformer.generation.generate import generate
from handformer.inference import static_step
from handformer.inference.static_step import eager_reason, static_step_for

pytestmark = pytest.mark.usefixtures("one_thread")


def _llama(**overrides):
    return CausalLMConfig.llama_style(**{**dict(vocab_size=48, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64,
                                                n_layers=2, max_positions=300), **overrides})


FAMILIES = {
    "gpt2": lambda: CausalLMConfig.gpt2_style(vocab_size=48, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                              max_positions=300),
    "llama_gqa": _llama,
    "qwen3": lambda: _llama(qk_norm="head", head_dim=16),
    "gemma2_no_window": lambda: _llama(norm="rmsnorm_offset", activation="geglu_tanh", scale_embeddings=True,
                                       tie_embeddings=True, head_dim=16, norm_placement="sandwich",
                                       attn_scale_dim=16, attn_softcap=5.0, logit_softcap=3.0),
}
EAGER = {
    "sliding window": lambda: _llama(sliding_window=4),
    "mixture of experts": lambda: _llama(moe=MoEConfig(4, 2)),
    "LongRoPE": lambda: _llama(rope_scaling=LongRopeScaling(short_factor=[1.0] * 4, long_factor=[2.0] * 4,
                                                            original_max_positions=16)),
}


def _model(build, seed=0):
    torch.manual_seed(seed)
    model = build_causal_lm(build()).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger weights than the init: tokens that vary
            p.mul_(4 if p.dim() > 1 else 1)
    return model


@pytest.fixture
def uncompiled(monkeypatch):
    monkeypatch.setattr(static_step.torch, "compile", lambda fn, **kw: fn)
    monkeypatch.setattr(static_step, "_STEPS", static_step.weakref.WeakKeyDictionary())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_static_step_gives_the_eager_tokens(family, uncompiled):
    model = _model(FAMILIES[family], seed=len(family))
    assert eager_reason(model) is None
    for batch in ([[1, 2, 3]], [[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [7, 8, 9, 10, 11]]):
        for temperature in (0, 1.0):  # sampled (seeded): tokens that vary, every position's logits matter
            eager = generate(model, batch, 20, temperature=temperature, seed=0)
            assert generate(model, batch, 20, temperature=temperature, seed=0, compile_step=True) == eager
    assert len(set(eager[1])) > 5
    # rows 1 and 2 compiled (static) steps; the padded batch went eager: no shape of 2 rows x 5 columns
    assert sorted(static_step_for(model).compile_seconds) == [(1, 256), (2, 256)]


@pytest.mark.parametrize("why", list(EAGER))
def test_models_the_static_step_does_not_serve_decode_eagerly(why, uncompiled):
    model = _model(EAGER[why])
    assert why.lower() in eager_reason(model).lower() and static_step_for(model) is None
    eager = generate(model, [[1, 2, 3]], 12, temperature=0)
    assert generate(model, [[1, 2, 3]], 12, temperature=0, compile_step=True) == eager


def test_the_captured_step_gives_the_eager_tokens(monkeypatch):
    """The step as torch.compile captures it (dynamo's graph and guards, `aot_eager`'s functionalized
    graph) decodes eager's tokens; Inductor's C++ code generation of the same graph is the slow
    test below (7-15 s of compiling)."""
    import functools

    monkeypatch.setattr(static_step.torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    model = _model(lambda: _llama(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32))
    eager = generate(model, [[1, 2, 3]], 10, temperature=0)
    assert generate(model, [[1, 2, 3]], 10, temperature=0, compile_step=True) == eager
    assert list(static_step_for(model).compile_seconds) == [(1, 256)]


@pytest.mark.slow
def test_the_inductor_compiled_step_gives_the_eager_tokens():
    """One compiled artifact: a one-layer Llama, one row (Inductor's C++ code generation)."""
    model = _model(lambda: _llama(n_layers=1, d_model=16, n_heads=2, n_kv_heads=1, d_ff=32))
    eager = generate(model, [[1, 2, 3]], 10, temperature=0)
    assert generate(model, [[1, 2, 3]], 10, temperature=0, compile_step=True) == eager
    assert generate(model, [[5, 4]], 6, temperature=0, compile_step=True) == generate(
        model, [[5, 4]], 6, temperature=0)  # another length, the same capacity bucket: no recompile
    seconds = static_step_for(model).compile_seconds
    assert list(seconds) == [(1, 256)] and seconds[(1, 256)] > 0
