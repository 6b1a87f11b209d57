"""Benchmark: structured output's cost in `handformer serve`: tokens/s with a JSON schema against
without, at batch 1 and batch 8, on a GPT-2-124M-shaped model.

The model: GPT-2 124M's shape (12 layers, d_model 768, 12 heads, 1024 positions) with random
weights, prepared for decoding as serve prepares it; its vocabulary a byte-level BPE of 50,257
tokens trained on tiny Shakespeare and Multi30k (as benchmarks/grammar_engines.py builds it). The
engine is serve's own (serve/engine.py: BatchEngine, its thread, its sinks), driven in process: `--batch`
sequences stay in flight (a finished one is replaced at once, as clients that send again), each
sampling at temperature 1 with its own seed, up to --max-tokens new tokens; with the schema each
carries a grammar constraint (generation/grammar.py), so it ends as soon as its JSON is complete.
tokens/s counts every generated token over the wall time.

Like with like: a reply with the schema ends sooner than a free one (its JSON complete, about 40
tokens against --max-tokens), and shorter replies mean more prefills for the same tokens. So the
run without the schema that the target is held to ("same lengths") generates, sequence by
sequence, as many tokens as the run with the schema just did (its max_tokens set to them, no stop
token): the same prompts, the same sequence lengths, the same prefills, the same batches; only
the constraint differs. The free run (every sequence up to --max-tokens or its end token) is
printed beside it. With and without alternate, --rounds rounds; the medians of the tokens/s are
printed, and each ratio is the median of the rounds' own ratios (runs side by side, so a load that
comes and goes on a shared machine moves both sides of a ratio alike). Target: with >= 0.9x without
(same lengths).

    python benchmarks/serve_schema.py                  # ~8 min on 2 shared cores
    python benchmarks/serve_schema.py --tokens 64 --rounds 1    # a smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from grammar_engines import gpt2_sized_tokenizer  # noqa: E402

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.generation.engine import SamplingOptions  # noqa: E402
from handformer.generation.grammar import Grammar, Vocabulary  # noqa: E402
from handformer.inference.prepare import prepare_for_decoding  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.serve.engine import BatchEngine, Sequence  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 8}},
    "required": ["name", "age", "tags"], "additionalProperties": False}


def gpt2_124m(vocab_size: int) -> CausalLM:
    torch.manual_seed(0)
    cfg = CausalLMConfig.gpt2_style(vocab_size=vocab_size, d_model=768, n_heads=12, d_ff=3072, n_layers=12,
                                    max_positions=1024, dropout=0.0)
    return prepare_for_decoding(CausalLM(cfg).eval())


class Count:
    """A sink that counts tokens and, when its sequence ends, records its length and starts the
    next one."""

    def __init__(self, bench: Bench, index: int) -> None:
        self.bench, self.index, self.tokens = bench, index, 0

    def token(self, token_id, logprob, top, is_stop_token) -> bool:
        self.bench.tokens += 1
        self.tokens += 1
        return False

    def finish(self, reason: str) -> None:
        self.bench.lengths[self.index] = self.tokens
        self.bench.next()

    def fail(self, message: str, status: int = 500) -> None:
        if not self.bench.done.is_set():  # the ones still running at the end are stopped
            self.bench.failed = message
            self.bench.done.set()


class Bench:
    """`total` tokens from sequences kept in flight. `lengths`: when given, sequence k generates
    exactly lengths[k] tokens (max_tokens, no stop token); the lengths of this run's sequences
    are recorded in `self.lengths`."""

    def __init__(self, engine: BatchEngine, prompt: list[int], max_tokens: int, grammar: Grammar | None,
                 stop: list[int], total: int, lengths: dict[int, int] | None = None) -> None:
        self.engine, self.prompt, self.max_tokens, self.grammar = engine, prompt, max_tokens, grammar
        self.stop, self.total, self.replay = stop, total, lengths
        self.tokens = self.started = 0
        self.done = threading.Event()
        self.counted = 0  # tokens when `total` was reached
        self.failed: str | None = None
        self.lengths: dict[int, int] = {}

    def next(self) -> None:
        if self.tokens >= self.total:
            self.counted = self.counted or self.tokens
            self.done.set()
            return
        index, self.started = self.started, self.started + 1
        constraint = self.grammar.constraint(self.stop) if self.grammar is not None else None
        options = SamplingOptions(temperature=1.0, seed=self.started)
        max_tokens, stop = self.max_tokens, frozenset(self.stop)
        if self.replay is not None and index in self.replay:
            max_tokens, stop = self.replay[index], frozenset()
        self.engine.submit(Sequence(self.prompt, max_tokens, options, stop, Count(self, index), constraint))


def measure(model: CausalLM, prompt: list[int], batch: int, max_tokens: int, total: int,
            grammar: Grammar | None, stop: list[int], lengths: dict[int, int] | None = None,
            ) -> tuple[float, dict[int, int]]:
    """tokens/s, and the length of each sequence that ended (by the order they started in)."""
    engine = BatchEngine(model, threading.Lock(), max_batch=batch)
    bench = Bench(engine, prompt, max_tokens, grammar, stop, total, lengths)
    for _ in range(batch):  # all queued before the engine starts: one prefill for the first batch
        bench.next()
    start = time.perf_counter()
    engine.start()
    bench.done.wait()
    seconds = time.perf_counter() - start
    engine.stop()
    if bench.failed:
        raise SystemExit(f"a sequence failed: {bench.failed}")
    return bench.counted / seconds, bench.lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=256, help="tokens generated per measurement")
    parser.add_argument("--max-tokens", type=int, default=64, help="most new tokens of one sequence")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = gpt2_sized_tokenizer()
    model = gpt2_124m(tok.vocab_size)
    stop = [tok.eos_id]
    t0 = time.perf_counter()
    grammar = Grammar.json_schema(Vocabulary(tok, model.cfg.vocab_size, stop), SCHEMA)
    prepared = time.perf_counter() - t0
    prompt = [tok.bos_id] + tok.encode("Write the person as JSON: ")
    results: dict[tuple[int, str], list[float]] = {}
    lengths: dict[int, list[float]] = {}
    with torch.inference_mode():
        measure(model, prompt, 1, 8, 8, None, stop)  # warm-up
        for r in range(args.rounds):
            for batch in (1, 8):
                with_schema, made = measure(model, prompt, batch, args.max_tokens, args.tokens, grammar, stop)
                same, _ = measure(model, prompt, batch, args.max_tokens, args.tokens, None, stop, made)
                free, _ = measure(model, prompt, batch, args.max_tokens, args.tokens, None, stop)
                for name, value in (("with schema", with_schema), ("same lengths", same), ("free", free)):
                    results.setdefault((batch, name), []).append(value)
                lengths.setdefault(batch, []).append(statistics.mean(made.values()))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"\nserve with a JSON schema: GPT-2-124M-shaped model, vocabulary {tok.vocab_size}, "
          f"{args.tokens} tokens a measurement, <= {args.max_tokens} a sequence, {args.threads} threads, "
          f"medians of {args.rounds} rounds "
          f"(vocabulary and grammar prepared in {prepared:.2f} s)\n")
    print(f"{'batch':>5} {'reply tokens':>12} {'with schema':>12} {'without, same lengths':>22} {'ratio':>6}"
          f" {'without, free':>14} {'ratio':>6}   (tokens/s)")
    for batch in (1, 8):
        m = {name: statistics.median(results[(batch, name)])
             for name in ("with schema", "same lengths", "free")}
        with_schema = results[(batch, "with schema")]
        ratio = {name: statistics.median(w / o for w, o in zip(with_schema, results[(batch, name)]))
                 for name in ("same lengths", "free")}  # each round's own ratio, then their median
        print(f"{batch:>5} {statistics.mean(lengths[batch]):>12.1f} {m['with schema']:>12.1f} "
              f"{m['same lengths']:>22.1f} {ratio['same lengths']:>5.2f}x {m['free']:>14.1f} "
              f"{ratio['free']:>5.2f}x")


if __name__ == "__main__":
    main()
