"""The continuous-batching engine without HTTP: sequences that join a running batch at different
steps, with different prompts, lengths and sampling settings, get exactly the tokens `generate`
gives each alone (GPT-2 style with learned positions, Llama style with RoPE, a sliding window);
rows leave when done or cancelled; a failing forward pass fails its sequences, not the engine.
And the incremental text: stop strings held back and cut, partial UTF-8 held back."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from handformer.config import CausalLMConfig
from handformer.generation.engine import SamplingOptions
from handformer.generation.generate import generate
from handformer.models.causal_lm import CausalLM
from handformer.serve.engine import BatchEngine, Sequence
from handformer.serve.text import IncrementalText

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB = 40


def tiny_model(preset: str) -> CausalLM:
    size = dict(vocab_size=VOCAB, n_layers=2, d_model=32, n_heads=4, d_ff=48, dropout=0.0, max_positions=64)
    if preset == "gpt2":
        cfg = CausalLMConfig.gpt2_style(**size, tie_embeddings=False)
    else:
        cfg = CausalLMConfig.llama_style(**size, n_kv_heads=2, sliding_window=6 if preset == "window" else None)
    torch.manual_seed(0)
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(3)
    return model


def wait_until(condition, timeout: float = 60.0) -> None:
    """Wait for another thread to make `condition()` true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


class Gate:
    """Stands in for the model's lock: each forward pass of the engine (a prefill or a step)
    waits for a permit from the test, so the test knows where the engine is."""

    def __init__(self) -> None:
        self.permits = threading.Semaphore(0)
        self.entered = 0  # forward passes begun, the one waiting for its permit included

    def __enter__(self) -> None:
        self.entered += 1
        assert self.permits.acquire(timeout=30)

    def __exit__(self, *exc) -> None:
        pass


class Collect:
    def __init__(self) -> None:
        self.tokens, self.reason, self.ended = [], None, threading.Event()

    def token(self, token_id, logprob, top, is_stop_token) -> bool:
        self.tokens.append(token_id)
        return False

    def finish(self, reason: str) -> None:
        self.reason = reason
        self.ended.set()

    def fail(self, message: str, status: int = 500) -> None:
        self.reason = "failed: " + message
        self.ended.set()


def _options(i: int) -> SamplingOptions:
    return SamplingOptions(temperature=(0.0, 1.0, 0.7, 1.5)[i % 4], top_k=(None, 8)[i % 2],
                           top_p=(None, None, 0.9)[i % 3], seed=i)


@pytest.mark.parametrize("preset", ["gpt2", "llama", "window"])
def test_batched_tokens_equal_each_sequence_alone(preset):
    model = tiny_model(preset)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (int(torch.randint(1, 15, (1,), generator=g)),), generator=g).tolist()
               for _ in range(12)]
    gate = Gate()
    engine = BatchEngine(model, gate, max_batch=8)
    seqs = [Sequence(p, 8 + 2 * i, _options(i), frozenset({3}), Collect()) for i, p in enumerate(prompts)]
    # half before the engine starts (prefilled together), the rest after its first step: two join
    # at the second step, and four wait for room (max_batch 8) and join as rows end
    for seq in seqs[:6]:
        engine.submit(seq)
    engine.start()
    wait_until(lambda: gate.entered == 1)  # at the first six's prefill
    gate.permits.release(1)
    wait_until(lambda: gate.entered == 2)  # at the first step
    for seq in seqs[6:]:
        engine.submit(seq)
    gate.permits.release(10_000)
    for seq in seqs:
        assert seq.sink.ended.wait(20)
    engine.stop()
    for i, (seq, prompt) in enumerate(zip(seqs, prompts)):
        o = seq.options
        alone = generate(model, [prompt], seq.max_tokens, temperature=o.temperature, top_k=o.top_k,
                         top_p=o.top_p, seed=o.seed, stop_tokens=[3])[0]
        assert seq.sink.tokens == alone, i
        assert seq.sink.reason == ("stop" if alone[-1] == 3 else "length")
    lengths = [len(seq.sink.tokens) for seq in seqs]
    assert engine.largest_batch == largest_batch(lengths, first=6, max_batch=8)


def largest_batch(lengths: list[int], first: int, max_batch: int) -> int:
    """The most rows one step decodes when sequences that get `lengths` tokens (an end token
    included) join as in the test above: the first `first` prefilled together, one step, then the
    rest admitted oldest first before each later step, as many as the batch has room for."""
    made = dict.fromkeys(range(first), 1)  # tokens each admitted sequence has; a prefill gives one
    waiting, largest, step = list(range(first, len(lengths))), 0, 0
    while True:
        if step > 0:
            room = max_batch - sum(made[i] < lengths[i] for i in made)
            made.update(dict.fromkeys(waiting[:max(room, 0)], 1))
            waiting = waiting[max(room, 0):]
        live = [i for i in made if made[i] < lengths[i]]
        if not live and not waiting:
            return largest
        largest = max(largest, len(live))
        for i in live:
            made[i] += 1
        step += 1


def test_cancelled_rows_leave_and_a_failing_step_fails_only_its_sequences():
    model = tiny_model("llama")
    engine = BatchEngine(model, threading.Lock())
    gone = Sequence([1, 2, 3], 60, SamplingOptions(seed=0), frozenset(), Collect())
    gone.cancel()
    engine.submit(gone)
    bad = Sequence([1, 2, VOCAB + 5], 5, SamplingOptions(seed=0), frozenset(), Collect())  # id out of range
    engine.submit(bad)
    engine.start()
    assert bad.sink.ended.wait(10) and bad.sink.reason.startswith("failed: generation failed")
    good = Sequence([1, 2, 3], 5, SamplingOptions(temperature=0), frozenset(), Collect())
    engine.submit(good)
    assert good.sink.ended.wait(10) and good.sink.reason == "length"
    assert gone.sink.tokens == [] and not gone.sink.ended.is_set()
    engine.stop()


def test_stopping_the_engine_fails_what_is_left():
    gate = Gate()
    engine = BatchEngine(tiny_model("gpt2"), gate)
    engine.start()
    running = Sequence([1], 50, SamplingOptions(), frozenset(), Collect())
    engine.submit(running)
    wait_until(lambda: gate.entered == 1)  # the engine waits at the prompt's forward pass
    stopper = threading.Thread(target=engine.stop)
    stopper.start()
    wait_until(lambda: engine._closing)  # asked to stop while it waits
    gate.permits.release(10_000)
    stopper.join(10)
    assert not stopper.is_alive()
    # the prefill and the step after it finish (two tokens); no further step begins
    assert running.sink.reason == "failed: the server is shutting down"
    assert running.generated == 2 and gate.entered == 2
    late = Sequence([1], 5, SamplingOptions(), frozenset(), Collect())
    engine.submit(late)
    assert late.sink.reason == "failed: the server is shutting down"


def test_stop_strings_are_held_back_then_cut():
    pieces = ["He", "llo", " wor", "ld", "!", " more"]
    text = IncrementalText(lambda ids: "".join(pieces[i] for i in ids), stop=["world", "xyz"])
    assert text.push(0) == ("He", False)
    assert text.push(1) == ("llo", False)
    assert text.push(2) == (" ", False)  # "wor" could start "world": held back
    assert text.push(3) == ("", True)  # "world" found: the text ends before it
    assert text.text == "Hello " and text.flush() == ""


def test_partial_utf8_is_held_back_until_complete():
    raw = "é".encode()
    text = IncrementalText(lambda ids: bytes(raw[i] for i in ids).decode("utf-8", errors="replace"))
    assert text.push(0) == ("", False)
    assert text.push(1) == ("é", False)
    assert text.flush() == ""


def test_the_engine_gives_freed_memory_back_each_time_it_goes_idle(monkeypatch):
    """A server's batches free their KV caches into glibc's heap, which keeps the pages: the
    engine returns them to the kernel when nothing is left to decode (once per busy spell, never
    while a sequence is decoding, never before the first)."""
    from handformer.serve import engine as engine_module

    trims = []
    monkeypatch.setattr(engine_module, "give_back_freed_memory", lambda: trims.append(1) or True)
    monkeypatch.setattr(engine_module, "GIVE_BACK_EVERY_S", 3600.0)  # only when idle
    gate = Gate()
    engine = BatchEngine(tiny_model("llama"), gate)
    engine.start()
    for spell in (1, 2):
        seq = Sequence([1, 2, 3], 4, SamplingOptions(seed=spell), frozenset(), Collect())
        engine.submit(seq)
        wait_until(lambda spell=spell: gate.entered == 4 * (spell - 1) + 1)  # at its prefill
        assert len(trims) == spell - 1
        gate.permits.release(4)  # the prefill and three steps
        assert seq.sink.ended.wait(10) and seq.sink.reason == "length"
        wait_until(lambda spell=spell: len(trims) == spell)
    engine.stop()
    assert len(trims) == 2 and gate.entered == 8


def test_under_a_load_that_never_lets_up_freed_memory_is_given_back_every_so_often(monkeypatch):
    from handformer.serve import engine as engine_module

    trims = []
    monkeypatch.setattr(engine_module, "give_back_freed_memory", lambda: trims.append(1) or True)
    monkeypatch.setattr(engine_module, "GIVE_BACK_EVERY_S", 0.0)  # after every step
    gate = Gate()
    engine = BatchEngine(tiny_model("llama"), gate)
    engine.start()
    seq = Sequence([1, 2, 3], 6, SamplingOptions(seed=0), frozenset(), Collect())
    engine.submit(seq)
    wait_until(lambda: gate.entered == 1)
    gate.permits.release(3)  # the prefill and two steps
    wait_until(lambda: gate.entered == 4)  # at the third step: the rows still decoding
    assert len(trims) == 2  # one after each step
    gate.permits.release(10)
    assert seq.sink.ended.wait(10)
    engine.stop()


def test_freed_memory_given_back_leaves_the_process():
    """give_back_freed_memory (malloc_trim): pages freed in the middle of the heap, which glibc
    keeps, are returned to the kernel."""
    import ctypes
    import sys

    from handformer.training.cpu_memory import give_back_freed_memory

    if not sys.platform.startswith("linux"):
        assert not give_back_freed_memory()
        return
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def anon_mb() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024

    blocks = [libc.malloc(64 << 10) for _ in range(800)]  # 50 MB below the mmap threshold: the heap
    for b in blocks:
        ctypes.memset(b, 1, 64 << 10)
    pin = libc.malloc(64 << 10)  # above them, so the heap's top cannot simply shrink
    for b in blocks:
        libc.free(b)
    held = anon_mb()
    assert give_back_freed_memory()
    given_back = held - anon_mb()
    libc.free(pin)
    assert given_back > 30, given_back
