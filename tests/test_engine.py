"""The one decoding engine (handformer/generation/engine.py): every decoder-only caller drives it,
and only it chooses tokens; the KV cache is written only through its own methods; rows that join
and leave get what they get alone; logit processors and log-probabilities per row; a served
sliding-window model keeps a rolling cache of W slots and gives transformers' tokens."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest
import torch
from helpers import randomize_hf, require_module

from handformer.config import CausalLMConfig
from handformer.convert.hf_weights import model_from_hf
from handformer.generation.engine import Engine, Row, SamplingOptions, sampled_distribution
from handformer.generation.generate import generate
from handformer.models.causal_lm import CausalLM

pytestmark = pytest.mark.usefixtures("one_thread")
PACKAGE = Path(__file__).resolve().parent.parent / "handformer"
VOCAB = 50


def tiny(window: int | None = None, seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    cfg = CausalLMConfig.llama_style(vocab_size=VOCAB, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, n_layers=2,
                                     max_positions=96, sliding_window=window)
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)  # less uniform logits: tokens vary
    return model


def _calls(name: str) -> list[str]:
    """Package files that call `name(...)`. A file whose text never spells `name` cannot call it: only
    the others are parsed (a handful of the package's files, not all of them)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        if name not in source:
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name:
                found.append(str(path.relative_to(PACKAGE)))
    return found


def test_only_the_engine_chooses_tokens():
    assert _calls("next_tokens") == ["generation/engine.py"]
    for caller in ("generation/generate.py", "generation/chat.py", "serve/playground_lookups.py",
                   "serve/engine.py"):
        source = (PACKAGE / caller).read_text(encoding="utf-8")
        assert "Engine(" in source, caller


CACHE_STATE = {"keys", "values", "cross", "length", "slots", "max_length", "window"}


def test_the_kv_cache_is_written_only_through_its_own_methods():
    """No module but the cache's own (nn/kv_cache.py, generation/cache.py) assigns a cache's
    buffers or counters: the others call update, advance, truncate, reorder, regroup."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() in ("nn/kv_cache.py", "generation/cache.py"):
            continue
        source = path.read_text(encoding="utf-8")
        if "cache" not in source.lower():  # the target's text names a cache: this file has none to write
            continue
        for node in ast.walk(ast.parse(source)):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                while isinstance(target, ast.Subscript):
                    target = target.value
                if isinstance(target, ast.Attribute) and target.attr in CACHE_STATE \
                        and "cache" in ast.unparse(target.value).lower():
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {ast.unparse(node)[:60]}")
    assert not offenders, offenders


def test_rows_that_join_and_leave_get_what_they_get_alone():
    model = tiny()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, VOCAB, (int(n),), generator=g).tolist() for n in (3, 9, 1, 5, 12, 2)]
    options = [SamplingOptions(t, k, p, seed=10 + i) for i, (t, k, p) in
               enumerate([(0.0, None, None), (1.0, 8, None), (0.7, None, 0.9), (1.3, 5, 0.8), (0.0, None, None),
                          (1.0, None, None)])]
    rows = [Row(p, 6 + 2 * i, o, frozenset({7})) for i, (p, o) in enumerate(zip(prompts, options))]
    engine = Engine(model, compact=True)
    with torch.inference_mode():
        engine.add(rows[:3])
        engine.step()
        engine.step()
        engine.add(rows[3:5])  # join two steps later
        engine.step()
        engine.add(rows[5:])
        engine.run()
    for row, prompt, o in zip(rows, prompts, options):
        alone = generate(model, [prompt], row.max_new_tokens, temperature=o.temperature, top_k=o.top_k,
                         top_p=o.top_p, seed=o.seed, stop_tokens=[7])[0]
        assert row.tokens == alone
        assert row.finish_reason == ("stop" if alone[-1] == 7 else "length")
    assert engine.rows == [] and engine.cache is None and engine.largest_batch >= 4  # all left


def test_a_cache_the_engine_drops_is_freed_at_once_not_by_the_cycle_collector(monkeypatch):
    """Rows that join and leave replace the batch's cache (regroup) again and again: each dropped
    cache, its keys and values with it, is freed when its last reference goes (a cache and its
    layer views form no cycle), so a server's memory does not pile up dropped caches between two
    runs of Python's cycle collector."""
    import gc
    import weakref

    from handformer.nn.kv_cache import KVCache

    made = []
    init = KVCache.__init__
    monkeypatch.setattr(KVCache, "__init__", lambda self, *a, **k: (init(self, *a, **k),
                                                                      made.append(weakref.ref(self)))[0])
    model = tiny()
    rows = [Row([1 + i, 2, 3][: 1 + i % 3], 3 + i % 4, SamplingOptions(temperature=0)) for i in range(8)]
    engine = Engine(model, compact=True)
    gc.collect()
    gc.disable()
    try:
        with torch.inference_mode():
            for i in range(0, 8, 2):
                engine.add(rows[i:i + 2])
                engine.step()
            engine.run()
        alive = sum(ref() is not None for ref in made)
    finally:
        gc.enable()
    assert len(made) >= 8 and alive == 0


def test_a_row_may_be_cancelled_or_finished_by_its_caller():
    model = tiny()
    a, b = Row([1, 2, 3], 20, SamplingOptions(temperature=0)), Row([4, 5], 20, SamplingOptions(temperature=0))
    engine = Engine(model, compact=True)
    with torch.inference_mode():
        engine.add([a, b])
        a.cancel()
        b.finish("stop")  # a caller's own stop rule (serve's stop strings)
        assert engine.step() == []
    assert (a.finish_reason, b.finish_reason) == ("cancelled", "stop") and engine.rows == []
    assert len(a.tokens) == len(b.tokens) == 1


def test_logit_processors_act_on_their_own_row():
    model = tiny()
    options = SamplingOptions(temperature=1.5, seed=0)
    banned = generate(model, [[1, 2, 3]], 30, temperature=1.5, seed=0)[0][3]  # the 4th token drawn

    def ban(tokens, logits):
        logits = logits.clone()
        logits[banned] = float("-inf")
        return logits

    free = Row([1, 2, 3], 30, options)
    held = Row([1, 2, 3], 30, options, processors=(ban,))
    engine = Engine(model)
    with torch.inference_mode():
        engine.add([free, held])
        engine.run()
    first = free.tokens.index(banned)
    assert banned not in held.tokens and held.tokens[:first] == free.tokens[:first]


def test_log_probabilities_are_those_of_the_sampled_distribution():
    model = tiny()
    options = SamplingOptions(temperature=0.8, top_k=6, seed=1, top_logprobs=3)
    row = Row([5, 6, 7], 5, options, keep_logits=True)
    engine = Engine(model)
    with torch.inference_mode():
        choices = engine.add([row])
        while engine.live:
            choices += engine.step()
    for c in choices:
        expected = sampled_distribution(c.logits, options)
        assert c.logprob == pytest.approx(float(expected[c.token]), abs=1e-6)
        assert [i for i, _ in c.top] == expected.topk(3).indices.tolist()
        assert len([v for v in expected.tolist() if v > float("-inf")]) == 6  # top-k = 6 survivors


def test_without_a_cache_the_engine_gives_the_same_tokens():
    model = tiny()
    prompts = [[1, 2, 3, 4], [5], [6, 7]]
    cached = generate(model, prompts, 12, temperature=0)
    assert generate(model, prompts, 12, temperature=0, use_cache=False) == cached
    assert generate(model, prompts, 12, temperature=0.9, seed=4, use_cache=False) == \
        generate(model, prompts, 12, temperature=0.9, seed=4)


def test_a_bad_row_is_one_clear_error():
    engine = Engine(tiny())
    with pytest.raises(ValueError, match="needs 100 positions but the model has max_positions=96"):
        engine.add([Row([1] * 90, 11)])
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add([Row([], 3)])
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        engine.add([Row([1], 0)])
    with pytest.raises(ValueError, match="top_logprobs"):
        SamplingOptions(top_logprobs=-1)
    engine.add([Row([1, 2], 4)])
    with pytest.raises(ValueError, match="compact"):
        engine.add([Row([3], 2)])


# --- serving a sliding-window model -------------------------------------------------------------

WINDOW = 4


def test_a_served_sliding_window_model_keeps_a_rolling_cache_and_transformers_tokens():
    transformers = require_module("transformers", "pip install -e '.[dev]'")
    from handformer.serve.engine import BatchEngine, Sequence

    hf = transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
        num_hidden_layers=2, max_position_embeddings=96, sliding_window=WINDOW, attn_implementation="eager",
        rope_parameters={"rope_type": "default", "rope_theta": 1e4}))
    randomize_hf(hf, 0.5)
    model = model_from_hf(hf.config.to_dict(), hf.state_dict()).eval()
    prompts = [[1, 5, 9], [2, 3, 4, 6, 7, 8, 10], [11]]

    class Sink:
        def __init__(self) -> None:
            self.tokens, self.ended = [], threading.Event()

        def token(self, token_id, logprob, top, is_stop_token) -> bool:
            self.tokens.append(token_id)
            return False

        def finish(self, reason: str) -> None:
            self.ended.set()

        def fail(self, message: str, status: int = 500) -> None:
            self.ended.set()

    seqs = [Sequence(p, 30, SamplingOptions(temperature=0), frozenset(), Sink()) for p in prompts]
    engine = BatchEngine(model, threading.Lock())
    slots = []
    real_step = engine.engine.step

    def step():
        out = real_step()
        if engine.engine.cache is not None:
            slots.append(engine.engine.cache.keys[0].size(2))
        return out

    engine.engine.step = step
    for seq in seqs:
        engine.submit(seq)
    engine.start()
    for seq in seqs:
        assert seq.sink.ended.wait(30)
    engine.stop()
    assert slots and set(slots) == {WINDOW}  # memory constant: W slots however long the rows grow
    for seq, prompt in zip(seqs, prompts):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=30, min_new_tokens=30,
                              pad_token_id=0, eos_token_id=None)
        assert seq.sink.tokens == out[0, len(prompt):].tolist()
