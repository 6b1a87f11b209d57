"""Prefix caching (generation/prefix_cache.py): prompts that share a beginning reuse its keys and
values, and the tokens come out identical with and without the cache (greedy and seeded
sampling; GPT-2 style, Llama style, a sliding window); a shared system prompt is stored once; the
cache stays within its bytes, dropping the least recently used first; serve's default and
--prefix-cache-mb."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import require_module
from serve_helpers import Server, make_lm_run

from handformer import cli
from handformer.config import CausalLMConfig
from handformer.generation.engine import Engine, Row, SamplingOptions
from handformer.generation.prefix_cache import PrefixCache, default_prefix_cache_mb
from handformer.models.causal_lm import CausalLM
from handformer.serve.app import create_app
from handformer.serve.registry import load_served_models

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 40


def tiny_model(preset: str) -> CausalLM:
    size = dict(vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=4, d_ff=48, dropout=0.0, max_positions=96)
    if preset == "gpt2":
        cfg = CausalLMConfig.gpt2_style(**size)
    else:
        cfg = CausalLMConfig.llama_style(**size, n_kv_heads=2, sliding_window=24 if preset == "window" else None)
    torch.manual_seed(0)
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(3)
    return model


def decode_waves(model: CausalLM, prefix_cache: PrefixCache | None, prompts: list[list[int]],
                 options: list[SamplingOptions]) -> list[list[int]]:
    """Rows joining a running compact batch in three waves, as serve admits them."""
    engine = Engine(model, compact=True, prefix_cache=prefix_cache)
    rows = [Row(p, 10, o) for p, o in zip(prompts, options)]
    with torch.inference_mode():
        for wave in (rows[:2], rows[2:5], rows[5:]):
            engine.add(wave)
            for _ in range(3):
                engine.step()
        engine.run()
    return [row.tokens for row in rows]


@pytest.mark.parametrize("preset", ["gpt2", "llama", "window"])
def test_tokens_are_identical_with_and_without_the_prefix_cache(preset):
    model = tiny_model(preset)
    g = random.Random(0)
    system = [g.randrange(VOCAB) for _ in range(20)]
    prompts = [system + [g.randrange(VOCAB) for _ in range(g.randrange(1, 8))] for _ in range(6)]
    prompts.append(prompts[0] + [5, 6, 7])  # a later turn of the first conversation
    prompts.append([g.randrange(VOCAB) for _ in range(30)])  # longer than the window: never stored
    for options in ([SamplingOptions(temperature=0)] * 8,
                    [SamplingOptions(temperature=(0.7, 1.0, 1.4)[i % 3], top_k=(None, 9)[i % 2], seed=i)
                     for i in range(8)]):
        cache = PrefixCache(1 << 20, model.cfg.sliding_window)
        assert decode_waves(model, cache, prompts, options) == decode_waves(model, None, prompts, options)
        assert cache.hits == 5 and cache.reused_tokens >= 5 * 20  # all but the first wave and the stranger


def test_a_shared_system_prompt_is_stored_once():
    model = tiny_model("llama")
    cache = PrefixCache(1 << 20)
    system = list(range(1, 31))
    prompts = [system + [i, i + 1] for i in range(2, 18)]
    decode_waves(model, cache, prompts, [SamplingOptions(temperature=0)] * len(prompts))
    per_token = 2 * model.cfg.n_layers * model.cfg.n_kv_heads * model.cfg.head_dim * 4  # keys and values, fp32
    assert cache.bytes == (30 + 2 * len(prompts)) * per_token  # the 30 shared tokens once, 2 more per prompt
    assert len(system) in {len(n.tokens) for n in cache.nodes()}


def test_the_least_recently_used_prefixes_are_dropped_past_the_limit():
    model = tiny_model("llama")
    per_token = 2 * model.cfg.n_layers * model.cfg.n_kv_heads * model.cfg.head_dim * 4
    cache = PrefixCache(40 * per_token)  # room for two prompts of 20 tokens
    a, b, c = ([k] * 20 for k in (1, 2, 3))
    with torch.inference_mode():
        for prompt in (a, b):
            Engine(model, prefix_cache=cache).add([Row(prompt, 1)])
        assert cache.lookup(a + [9]) is not None  # a is used again: b is now the oldest
        Engine(model, prefix_cache=cache).add([Row(c, 1)])
    assert cache.bytes <= 40 * per_token
    assert cache.lookup(a + [9]) is not None and cache.lookup(c + [9]) is not None
    assert cache.lookup(b + [9]) is None


def test_the_window_bounds_what_is_stored_and_reused():
    model = tiny_model("window")  # a window of 24 positions
    cache = PrefixCache(1 << 20, model.cfg.sliding_window)
    long_prompt = list(range(1, 31))
    with torch.inference_mode():
        Engine(model, prefix_cache=cache).add([Row(long_prompt, 1), Row(long_prompt[:20], 1)])
    assert cache.lookup(long_prompt + [1]).length == 20  # the 30-token prompt did not fit its window
    with pytest.raises(ValueError, match="another sliding window"):
        Engine(model, prefix_cache=PrefixCache(1 << 20))


def test_serve_gives_the_same_replies_with_and_without_its_prefix_cache(tmp_path):
    openai = require_module("openai", "pip install -e '.[dev]'")
    models = load_served_models([str(make_lm_run(tmp_path / "story", max_positions=256))])
    system = {"role": "system", "content": "You are a fox who answers in riddles about the lazy dog. " * 2}
    turns = [[system, {"role": "user", "content": f"Hello, who are you {i}?"}] for i in range(3)]
    replies = {}
    for mb in (0, 16):
        server = Server(create_app(models, prefix_cache_mb=mb))
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
            replies[mb] = [client.chat.completions.create(model="story", messages=m, seed=i, max_tokens=12,
                                                          temperature=0.9).choices[0].message.content
                           for i, m in enumerate(turns)]
            cache = server.app.state.engines["story"].prefix_cache
            assert (cache is None) == (mb == 0)
            if cache is not None:
                assert cache.hits == 2 and cache.reused_tokens >= 2 * 100
        finally:
            server.stop()
    assert replies[0] == replies[16]


def test_the_default_size_and_the_command_line_option(tmp_path, monkeypatch, capsys):
    with open("/proc/meminfo") as f:
        total_mb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) / 1024
    assert default_prefix_cache_mb() == min(256.0, total_mb / 10)
    import uvicorn

    apps = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets: apps.append(self.config.app))
    run = make_lm_run(tmp_path / "story")
    assert cli.main(["serve", str(run), "--prefix-cache-mb", "0"]) == 0
    assert apps[-1].state.engines["story"].prefix_cache is None
    assert cli.main(["serve", str(run), "--prefix-cache-mb", "3"]) == 0
    assert apps[-1].state.engines["story"].prefix_cache.max_bytes == 3 * 2 ** 20
    assert cli.main(["serve", str(run), "--prefix-cache-mb", "-1"]) == 2
    assert "--prefix-cache-mb must be >= 0" in capsys.readouterr().err
