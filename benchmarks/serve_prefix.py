"""Benchmark: prefix caching in `handformer serve`, with the cache and without it (--prefix-cache-mb 0),
on a GPT-2-124M-shaped model (random weights, prepared for decoding as serve prepares it).

- Time to first token of turn 5 of a chat: a 1,000-token system prompt and four earlier turns of
  50 tokens (a 25-token question and a 25-token answer each), then the fifth question. The turns
  are sent one after another, as a chat client sends them; with the cache, turn 5 runs only what
  turn 4's prompt did not hold (the fourth answer and the fifth question). Target: >= 3x faster.
- Tokens/s of 16 clients sharing the system prompt: after one request with it, 16 at once, each
  with its own 20-token question, 32 new tokens each.

The engine is serve's own (serve/engine.py: BatchEngine, its thread), driven in process; the
tokens are random ids (what they spell does not change the work). Each figure is the median of
--rounds rounds; with and without alternate.

    python benchmarks/serve_prefix.py                 # ~3 min on 2 shared cores
    python benchmarks/serve_prefix.py --rounds 1      # a smoke run
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.generation.engine import SamplingOptions  # noqa: E402
from handformer.inference.prepare import prepare_for_decoding  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.serve.engine import BatchEngine, Sequence  # noqa: E402

VOCAB = 50257


class Sink:
    def __init__(self) -> None:
        self.first: float | None = None
        self.tokens = 0
        self.ended = threading.Event()

    def token(self, token_id, logprob, top, is_stop_token) -> bool:
        self.first = self.first or time.perf_counter()
        self.tokens += 1
        return False

    def finish(self, reason: str) -> None:
        self.ended.set()

    def fail(self, message: str, status: int = 500) -> None:
        raise SystemExit(f"a sequence failed: {message}")


def ask(engine: BatchEngine, prompt: list[int], max_tokens: int, seed: int) -> Sink:
    sink = Sink()
    options = SamplingOptions(temperature=1.0, seed=seed)
    engine.submit(Sequence(prompt, max_tokens, options, frozenset(), sink))
    return sink


def turn5_ttft(model: CausalLM, mb: float, rng: random.Random) -> float:
    """Seconds from sending turn 5 to its first token, after turns 1-4."""
    engine = BatchEngine(model, threading.Lock(), prefix_cache_mb=mb)
    engine.start()
    try:
        conversation = [rng.randrange(VOCAB) for _ in range(1000)]
        for turn in range(1, 6):
            conversation += [rng.randrange(VOCAB) for _ in range(25)]  # the question
            start = time.perf_counter()
            sink = ask(engine, list(conversation), 1, turn)
            sink.ended.wait()
            if turn == 5:
                return sink.first - start
            conversation += [rng.randrange(VOCAB) for _ in range(25)]  # the answer (generated in a real chat)
    finally:
        engine.stop()
    raise AssertionError("unreachable")


def shared_tokens_per_s(model: CausalLM, mb: float, rng: random.Random, clients: int) -> float:
    engine = BatchEngine(model, threading.Lock(), prefix_cache_mb=mb)
    engine.start()
    try:
        system = [rng.randrange(VOCAB) for _ in range(1000)]
        ask(engine, system + [1], 1, 0).ended.wait()  # the system prompt has been seen once
        start = time.perf_counter()
        questions = [[rng.randrange(VOCAB) for _ in range(20)] for _ in range(clients)]
        sinks = [ask(engine, system + q, 32, c) for c, q in enumerate(questions)]
        for sink in sinks:
            sink.ended.wait()
        return sum(s.tokens for s in sinks) / (time.perf_counter() - start)
    finally:
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = CausalLMConfig.gpt2_style(vocab_size=VOCAB, d_model=768, n_heads=12, d_ff=3072, n_layers=12,
                                    max_positions=1024 + 512, dropout=0.0)
    model = prepare_for_decoding(CausalLM(cfg).eval())
    cases = {"without (0 MB)": 0, "with (256 MB)": 256}
    ttft: dict[str, list[float]] = {name: [] for name in cases}
    rate: dict[str, list[float]] = {name: [] for name in cases}
    with torch.inference_mode():
        turn5_ttft(model, 0, random.Random(0))  # warm-up
        for r in range(args.rounds):
            for name, mb in cases.items():
                ttft[name].append(turn5_ttft(model, mb, random.Random(r)))
                rate[name].append(shared_tokens_per_s(model, mb, random.Random(r), args.clients))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"\nserve prefix cache: GPT-2-124M-shaped model (max_positions {cfg.max_positions}), "
          f"{args.threads} threads, "
          f"medians of {args.rounds} rounds\n")
    print(f"{'prefix cache':<16} {'turn-5 TTFT s':>14} {f'{args.clients} clients tok/s':>17}")
    for name in cases:
        print(f"{name:<16} {statistics.median(ttft[name]):>14.3f} {statistics.median(rate[name]):>17.1f}")
    a, b = (statistics.median(ttft[n]) for n in cases)
    c, d = (statistics.median(rate[n]) for n in cases)
    print(f"\nturn-5 time to first token: {a / b:.1f}x faster with the cache; "
          f"{args.clients} clients: {d / c:.2f}x "
          "the tokens/s")


if __name__ == "__main__":
    main()
