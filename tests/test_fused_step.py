"""The fused C decoding step (handformer/inference/fused_step.py, decoder_step.c): the default for a
Llama-style or GPT-2-style model at batch 1, with plain layers (a small model), packed ones with
their one-row copy (a large model) or int8 / int4 layers through the VNNI kernels (quantized before
preparing, as a quantized run loads: Q/K/V unfused), it gives the eager step's greedy tokens; it
leaves alone the models and batches it does not serve; without the C code (or, for int8 and int4,
without VNNI) the engine steps eagerly. A step of several tokens (speculation's check of its
guesses) gives each the logits of a one-token step, bit for bit, and speculation through it keeps
plain decoding's tokens."""

from collections.abc import Callable

import pytest
import torch

from handformer.config import CausalLMConfig
from handformer.generation import engine
from handformer.generation.engine import Engine
from handformer.generation.generate import generate
from handformer.generation.sampling import SamplingOptions, Speculation
from handformer.inference import c_kernels, fused_step
from handformer.inference.packed_linear import pack_linears
from handformer.inference.prepare import prepare_for_decoding
from handformer.inference.quant import Int8Linear, quantize_linears
from handformer.inference.quant_int4 import Int4Linear
from handformer.inference.threads import StepThreads
from handformer.models.causal_lm import CausalLM


def _tiny(style="llama_style", d_ff=44, bits=None, d_model=32, n_heads=4, **extra):
    """A tiny model, prepared for decoding; bits 8 or 4: quantized first (int4 in the Q4_0 form a
    GGUF file gives: zeros 0, float16 scales)."""
    torch.manual_seed(0)
    cfg = getattr(CausalLMConfig, style)(vocab_size=64, d_model=d_model, n_heads=n_heads, d_ff=d_ff, n_layers=2,
                                         max_positions=96, **extra)
    model = CausalLM(cfg).eval()
    with torch.no_grad():  # no zero biases, and activations large enough for GELU's cubic term to count
        for p in model.parameters():
            p.normal_(0.0, 0.3)
        if bits is not None:
            quantize_linears(model, bits=bits, group_size=32)
            for m in model.modules():
                if isinstance(m, Int4Linear):
                    m.scales.copy_(m.scales.half().float())
                    m.zeros.zero_()
    return prepare_for_decoding(model)


def _packed(model):
    """Every linear layer packed, as a large model's are (each with its one-row copy)."""
    pack_linears(model, min_bytes=0)
    return model


KINDS = {  # grouped-query attention: two query heads a key/value head
    "llama": lambda: _tiny(n_kv_heads=2),
    "gpt2": lambda: _tiny("gpt2_style"),  # LayerNorm, learned positions, GELU (tanh), biases
    "gpt2, erf GELU, packed": lambda: _packed(_tiny("gpt2_style", d_ff=48, activation="gelu")),
    "llama, packed": lambda: _packed(_tiny(d_ff=48, n_kv_heads=2)),
    "llama, int8": lambda: _tiny(d_ff=64, n_kv_heads=2, bits=8),  # q, k, v and gate, up unfused
    "gpt2, int4": lambda: _tiny("gpt2_style", d_ff=64, bits=4),
    # heads of 32 and 64 numbers: attention through AVX-512 (heads of 8 above: the plain loops)
    "gpt2, heads of 32, int8": lambda: _tiny("gpt2_style", d_ff=64, d_model=64, n_heads=2, bits=8),
    "llama, heads of 64, packed": lambda: _packed(_tiny(d_ff=64, d_model=128, n_heads=2, n_kv_heads=1)),
}
KIND_OF = {"packed": fused_step.BLOCKED, "int8": fused_step.INT8, "int4": fused_step.INT4}


def _skip_without_vnni(kind):
    if kind.endswith(("int8", "int4")) and c_kernels.kernel("int8_vnni_linear") is None:
        pytest.skip(f"no VNNI kernels here: {c_kernels.why_not('int8_vnni_linear')}")


@pytest.fixture(scope="module")
def models():
    if c_kernels.kernel("decoder_step") is None:
        pytest.skip(f"the fused step cannot be built here: {c_kernels.why_not('decoder_step')}")
    return {kind: make() for kind, make in KINDS.items()}


@pytest.fixture(scope="module")
def model(models):
    return models["llama"]


def _eager(monkeypatch):
    monkeypatch.setattr(engine, "fused_step_for", lambda model: None)


@pytest.mark.parametrize("kind", KINDS)
@torch.inference_mode()
def test_greedy_tokens_are_the_eager_steps(models, kind, monkeypatch):
    _skip_without_vnni(kind)
    model = models[kind]
    step = fused_step.fused_step_for(model)
    assert step is not None and Engine(model).static is step
    # the packed layers' one-row copies, or the quantized layers' stored weights, are read
    assert set(step.kinds) == {KIND_OF.get(kind.split(", ")[-1], fused_step.PLAIN)}
    prompts = [[1, 5, 9, 2], [7]]
    fused = [generate(model, [p], 40, temperature=0) for p in prompts]
    _eager(monkeypatch)
    assert [generate(model, [p], 40, temperature=0) for p in prompts] == fused


@pytest.mark.parametrize("kind", KINDS)
@torch.inference_mode()
def test_its_logits_are_the_models(models, kind):
    _skip_without_vnni(kind)
    model = models[kind]
    cache = model.new_cache(16)
    model(torch.tensor([[3, 4, 5]]), cache=cache)
    ids = torch.tensor([[6]])
    step = fused_step.fused_step_for(model)
    assert step.usable(cache, None)
    expected = model(ids, cache=cache).logits[:, -1]  # (1, V), eagerly: writes column 3
    cache.truncate(3)
    torch.testing.assert_close(step(ids, cache), expected, atol=1e-5, rtol=1e-5)
    assert cache.length == 4


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("kind", ["llama", "gpt2, int4", "gpt2, heads of 32, int8", "llama, heads of 64, packed"])
@torch.inference_mode()
def test_threads_split_the_step_without_changing_it(models, kind, threads):
    """One team of threads for the whole step: each computes its share of every product (Q/K/V by
    key/value head where the heads divide among the threads, else by rows and a wait) and its heads'
    attention; the logits are those of one thread."""
    _skip_without_vnni(kind)
    model, step = models[kind], fused_step.fused_step_for(models[kind])
    cache = model.new_cache(16)
    model(torch.tensor([[3, 4, 5, 9, 1]]), cache=cache)
    ids, before = torch.tensor([[6]]), torch.get_num_threads()
    assert step.usable(cache, None)
    step.pace = StepThreads()  # a fresh choice: the team runs the first step
    try:
        torch.set_num_threads(1)
        alone = step(ids, cache)
        cache.truncate(5)
        torch.set_num_threads(threads)
        together = step(ids, cache)
    finally:
        torch.set_num_threads(before)
    assert step.shape.threads == threads
    assert torch.equal(together, alone), (together - alone).abs().max()  # every output row the same code


def _paced(team: Callable[[int], float], steps: int) -> list[int]:
    """The threads StepThreads gives each of `steps` steps at torch's count 2, on made-up times: a
    team step team(i) seconds, a one-thread step 0.018."""
    pace, ran = StepThreads(), []
    for i in range(steps):
        threads = pace.choose(2)
        ran.append(threads)
        pace.record(threads, team(i) if threads == 2 else 0.018)
    return ran


def test_a_slow_team_hands_the_step_to_one_thread_and_takes_it_back():
    """StepThreads on made-up step times: two slow team steps in a row, a probe of one thread that
    wins, one thread until a probe of the team wins again; on a quiet pace no probe runs."""
    ran = _paced(lambda i: 0.100 if 5 <= i < 50 else 0.012, 120)
    assert ran[:7] == [2] * 7 and ran[7] == 1  # steps 5 and 6 slow, step 7 the probe
    assert ran[8:24] == [1] * 16 and ran[24] == 2  # the team retried after 16 steps, lost
    assert 2 not in ran[25:57]  # the next retry 32 steps on
    assert ran[57:] == [2] * 63  # the load gone at step 50: the team took over at its next retry, 57
    assert _paced(lambda i: 0.012, 100) == [2] * 100
    assert StepThreads().choose(1) == 1


def test_the_team_must_beat_one_thread_by_a_margin_and_retries_at_most_64_steps_apart():
    """A team step barely faster than the one-thread steps' median (a busy core's lucky step) does not
    take the step back; under a long load the team's retries come 16, 32, 64, 64, ... steps apart,
    so the team is back at most 65 steps after the load ends."""
    ran = _paced(lambda i: 0.100 if 5 <= i < 7 else 0.017, 300)  # 0.017: 0.94 of one thread's 0.018
    assert ran[7] == 1 and ran[8:].count(2) == 5  # only the probes ran on the team: it never took over
    ran = _paced(lambda i: 0.100 if 5 <= i < 600 else 0.012, 700)
    retries = [i for i in range(8, 700) if ran[i] == 2]
    gaps = [b - a for a, b in zip(retries, retries[1:])]
    assert gaps[:5] == [33, 65, 65, 65, 65]  # 16, 32, 64 one-thread steps between team steps
    back = next(i for i in retries if i >= 600)
    assert back - 600 <= 65 and ran[back:] == [2] * (700 - back)


@torch.inference_mode()
def test_batches_and_other_models_step_eagerly(model):
    cache = model.new_cache(16)
    model(torch.tensor([[3, 4], [5, 6]]), cache=cache)  # two rows
    assert not fused_step.fused_step_for(model).usable(cache, None)
    assert fused_step.fused_reason(_tiny("gpt2_style", activation="relu")) is not None
    assert fused_step.fused_reason(_tiny(sliding_window=8)) is not None
    other_int8 = _tiny(d_ff=64, bits=8)
    other_int8.lm_head.kernel = "c-fp32"  # its eager step widens the int8 weights: not the VNNI numbers
    assert "through the VNNI kernel" in fused_step.fused_reason(other_int8)


@torch.inference_mode()
def test_without_vnni_an_int8_model_decodes_eagerly(monkeypatch):
    """No VNNI kernel (a CPU without VNNI): the quantized model's layers run c-fp32 or torch's kernels
    eagerly, and the fused step leaves it to them; the fp32 model keeps its fused step."""
    kernel = c_kernels.kernel
    monkeypatch.setattr(c_kernels, "kernel", lambda name="int8_linear": None if name in c_kernels.VNNI
                        else kernel(name))
    model = _tiny(d_ff=64, bits=8)
    assert isinstance(model.lm_head, Int8Linear)
    assert fused_step.fused_step_for(model) is None and Engine(model).static is None
    assert fused_step.fused_step_for(_tiny()) is not None or kernel("decoder_step") is None
    assert len(generate(model, [[1, 5, 9]], 6, temperature=0)[0]) == 6


def test_a_step_is_made_again_for_replaced_weights(model):
    step = fused_step.fused_step_for(model)
    assert fused_step.fused_step_for(model) is step
    layer = model.layers[0].self_attn.o_proj
    old = layer.weight
    layer.weight = torch.nn.Parameter(old.detach() * 2, requires_grad=False)  # a new tensor
    try:
        assert fused_step.fused_step_for(model) is not step
    finally:
        layer.weight = old


def test_without_the_c_code_there_is_no_fused_step(monkeypatch):
    monkeypatch.setattr(c_kernels, "kernel", lambda name: None)
    assert fused_step.fused_step_for(_tiny()) is None


def test_a_cache_the_step_cannot_serve_is_a_clear_error(model):
    """Nothing cached yet, two rows, or a full cache: a ValueError naming what it needs, never a read
    past the C step's buffers."""
    step, token = fused_step.fused_step_for(model), torch.zeros(1, 1, dtype=torch.long)
    two_rows, full = model.new_cache(8), model.new_cache(4)
    with torch.no_grad():
        model(torch.zeros(2, 3, dtype=torch.long), cache=two_rows)
        model(torch.zeros(1, 4, dtype=torch.long), cache=full)
    for cache in (model.new_cache(8), two_rows, full):
        with pytest.raises(ValueError, match="one-row fp32 KVCache"):
            step(token, cache)


@pytest.mark.parametrize("tokens", [2, 5, 8])  # one group of rows a weight block, a group of 5, two of 4
@pytest.mark.parametrize("kind", KINDS)
@torch.inference_mode()
def test_a_step_of_several_tokens_is_one_token_steps_bit_for_bit(models, kind, tokens):
    """Each weight read once for all the tokens, each token's sums in the one-token step's order: the
    same logits, bit for bit, and those of the eager one-token steps up to the order of the sums."""
    _skip_without_vnni(kind)
    model, step = models[kind], fused_step.fused_step_for(models[kind])
    cache = model.new_cache(16)
    model(torch.tensor([[3, 4, 5]]), cache=cache)
    ids = torch.tensor([[6, 1, 9, 2, 7, 7, 0, 4][:tokens]])  # (1, T)
    assert step.usable(cache, None, tokens)
    together = step(ids, cache)  # (T, V)
    assert together.shape == (tokens, model.cfg.vocab_size) and cache.length == 3 + tokens
    cache.truncate(3)
    one_by_one = torch.cat([step(ids[:, i:i + 1], cache) for i in range(tokens)])
    assert torch.equal(together, one_by_one), (together - one_by_one).abs().max()
    cache.truncate(3)
    eager = torch.cat([model(ids[:, i:i + 1], cache=cache).logits[:, -1] for i in range(tokens)])
    torch.testing.assert_close(together, eager, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "llama, heads of 64, packed", "gpt2, heads of 32, int8"])
@torch.inference_mode()
def test_threads_split_a_step_of_several_tokens_without_changing_it(models, kind):
    _skip_without_vnni(kind)
    model, step = models[kind], fused_step.fused_step_for(models[kind])
    cache, ids, before = model.new_cache(16), torch.tensor([[6, 1, 9, 2, 7]]), torch.get_num_threads()
    model(torch.tensor([[3, 4, 5]]), cache=cache)
    assert step.usable(cache, None, 5)
    step.pace = StepThreads()
    try:
        torch.set_num_threads(1)
        alone = step(ids, cache)
        cache.truncate(3)
        torch.set_num_threads(2)
        together = step(ids, cache)
    finally:
        torch.set_num_threads(before)
    assert step.shape.threads == 2 and torch.equal(together, alone)


REPEAT = [5, 9, 2, 7, 3, 8, 5, 9, 2, 7, 3, 8, 5, 9, 2]  # repetitive: prompt lookup finds drafts


@pytest.mark.parametrize("kind", ["gpt2", "llama, packed", "llama, int8"])
@torch.inference_mode()
def test_speculation_checks_its_guesses_in_one_fused_step(models, kind, monkeypatch):
    """Greedy tokens with prompt lookup are plain decoding's, whether the guesses are checked by the
    fused step (one call of several tokens) or, without the C step, by the model's forward."""
    _skip_without_vnni(kind)
    model, fed = models[kind], []
    call = fused_step.FusedStep.__call__
    monkeypatch.setattr(fused_step.FusedStep, "__call__", lambda self, ids, cache: fed.append(ids.size(1))
                        or call(self, ids, cache))
    plain = generate(model, [REPEAT], 40, temperature=0)
    fast = generate(model, [REPEAT], 40, temperature=0, speculate=Speculation())
    assert fast == plain and max(fed) == 8  # the newest token and 7 guesses (the default's most), one step
    _eager(monkeypatch)
    fed.clear()
    assert generate(model, [REPEAT], 40, temperature=0, speculate=Speculation(tokens=4)) == plain and not fed


@torch.inference_mode()
def test_sampled_tokens_through_the_fused_check_saw_exactly_their_context(models):
    """Sampling with speculation through the fused step: the kept guesses' keys stay in the cache, the
    rejected ones' are cut, so every token's logits are those of a full forward over what came before."""
    model = models["gpt2"]
    row = engine.Row(REPEAT, 40, SamplingOptions(1.0, seed=0, speculate=Speculation(tokens=3)), keep_logits=True)
    eng = Engine(model)
    choices = eng.add([row])
    while step := eng.step():
        choices += step
    assert isinstance(eng.static, fused_step.FusedStep)
    full = model(torch.tensor([REPEAT + row.tokens])).logits[0, len(REPEAT) - 1:-1]  # (n, V)
    torch.testing.assert_close(torch.stack([c.logits for c in choices]), full, atol=1e-4, rtol=1e-4)
    assert 0 < row.speculation.accepted < row.speculation.drafted


def test_a_step_refuses_more_tokens_than_it_feeds_or_the_cache_holds(model):
    step, cache = fused_step.fused_step_for(model), model.new_cache(8)
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
    assert step.usable(cache, None, 4) and not step.usable(cache, None, 5)
    assert not step.usable(model.new_cache(32), None, fused_step.MAX_ROWS + 1)
    with pytest.raises(ValueError, match="room for the new"):
        step(torch.zeros(1, 5, dtype=torch.long), cache)
