"""The continuous-batching engine without HTTP: sequences that join a running batch at different
steps, with different prompts, lengths and sampling settings, get exactly the tokens `generate`
gives each alone (GPT-2 style with learned positions, Llama style with RoPE, a sliding window);
rows leave when done or cancelled; a failing forward pass fails its sequences, not the engine.
And the incremental text: stop strings held back and cut, partial UTF-8 held back."""

from __future__ import annotations

import threading

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


class Collect:
    def __init__(self) -> None:
        self.tokens, self.reason, self.ended = [], None, threading.Event()

    def token(self, token_id, logprob, top, is_stop_token) -> bool:
        self.tokens.append(token_id)
        return False

    def finish(self, reason: str) -> None:
        self.reason = reason
        self.ended.set()

    def fail(self, message: str) -> None:
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
    engine = BatchEngine(model, threading.Lock(), max_batch=8)
    seqs = [Sequence(p, 8 + 2 * i, _options(i), frozenset({3}), Collect()) for i, p in enumerate(prompts)]
    # half before the engine starts, the rest while it runs: they join at different steps, and
    # four wait for room (max_batch 8)
    for seq in seqs[:6]:
        engine.submit(seq)
    engine.start()
    assert seqs[0].sink.ended.wait(10)
    for seq in seqs[6:]:
        engine.submit(seq)
    for seq in seqs:
        assert seq.sink.ended.wait(20)
    engine.stop()
    for i, (seq, prompt) in enumerate(zip(seqs, prompts)):
        o = seq.options
        alone = generate(model, [prompt], seq.max_tokens, temperature=o.temperature, top_k=o.top_k,
                         top_p=o.top_p, seed=o.seed, stop_tokens=[3])[0]
        assert seq.sink.tokens == alone, i
        assert seq.sink.reason == ("stop" if alone[-1] == 3 else "length")
    assert 1 < engine.largest_batch <= 8


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
    lock = threading.Lock()
    engine = BatchEngine(tiny_model("gpt2"), lock)
    engine.start()
    running = Sequence([1], 50, SamplingOptions(), frozenset(), Collect())
    with lock:  # the engine waits at the prompt's forward pass while it is asked to stop
        engine.submit(running)
        stopper = threading.Thread(target=engine.stop)
        stopper.start()
        while not engine._closing:
            pass
    stopper.join(10)
    assert running.sink.reason == "failed: the server is shutting down" and running.generated <= 2
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
