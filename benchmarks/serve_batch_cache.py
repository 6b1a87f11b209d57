"""Benchmark: how `handformer serve` keeps a continuous batch's KV cache, two designs
measured side by side on one decoding step of 16 rows of different lengths:

- padded batch cache (what serve uses: the decoding engine, handformer/generation/engine.py): the
  rows live in one left-padded cache; a step appends one column; rows are copied only when one
  joins or leaves (`DecodingCache.regroup`);
- one cache per sequence, stacked every step: each step copies every row's cache into a padded
  batch, runs the same forward, and copies the new keys/values back into each row's own cache.

Two model shapes with random weights: stories260K's (5 layers, 64 wide, vocab 512) and a larger
Llama-style one (8 layers, 512 wide, 8 / 4 heads, vocab 8,000). Rows hold 32 to --max-length
positions. Medians of --rounds interleaved rounds of --steps steps; 1 torch thread. Other jobs on
a shared machine make the figures noisy.

    python benchmarks/serve_batch_cache.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.generation.cache import DecodingCache  # noqa: E402
from handformer.generation.engine import Engine, Row, SamplingOptions  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.nn.kv_cache import KVCache  # noqa: E402

SHAPES = {
    "stories260K": dict(vocab_size=512, d_model=64, n_heads=8, n_kv_heads=4, d_ff=172, n_layers=5),
    "llama-8x512": dict(vocab_size=8000, d_model=512, n_heads=8, n_kv_heads=4, d_ff=1376, n_layers=8),
}


def prefilled(model: CausalLM, prompts: list[list[int]], extra: int) -> list[KVCache]:
    caches = []
    for prompt in prompts:
        cache = KVCache(model.cfg.n_layers, len(prompt) + extra)
        model(torch.tensor([prompt]), cache=cache, logits_to_keep=1)
        caches.append(cache)
    return caches


def padded_steps(model: CausalLM, prompts: list[list[int]], steps: int) -> float:
    engine = Engine(model, compact=True)
    engine.add([Row(p, steps + 2, SamplingOptions(temperature=0)) for p in prompts])  # prefill: untimed
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - start) / steps


def stacked_steps(model: CausalLM, prompts: list[list[int]], steps: int) -> float:
    own = prefilled(model, prompts, steps + 1)
    ids = torch.zeros(len(own), 1, dtype=torch.long)
    start = time.perf_counter()
    for _ in range(steps):
        width = max(c.length for c in own)
        batch = DecodingCache.regroup([(c, torch.tensor([0])) for c in own], width, width + 1)  # copies
        mask = torch.stack([torch.arange(width + 1) >= width - c.length for c in own])  # (B, S + 1)
        model(ids, mask, cache=batch, logits_to_keep=1)
        for row, o in enumerate(own):  # the new column back into each row's own cache
            for layer in range(model.cfg.n_layers):
                keys, values = batch.columns(layer)
                o.layer(layer).update(keys[row:row + 1, :, -1:], values[row:row + 1, :, -1:])
            o.advance(1)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"one decoding step of 16 rows holding 32 to {args.max_length} positions; medians of {args.rounds} "
          "interleaved rounds, 1 thread\n")
    print(f"{'model':<12} {'padded batch ms':>15} {'stacked each step ms':>20} {'stacked / padded':>16}")
    with torch.inference_mode():
        for name, shape in SHAPES.items():
            torch.manual_seed(0)
            cfg = CausalLMConfig.llama_style(**shape, max_positions=args.max_length + args.steps + 8)
            model = CausalLM(cfg).eval()
            lengths = torch.randint(32, args.max_length + 1, (16,)).tolist()
            prompts = [torch.randint(0, cfg.vocab_size, (n,)).tolist() for n in lengths]
            padded, stacked = [], []
            for _ in range(args.rounds):
                padded.append(padded_steps(model, prompts, args.steps))
                stacked.append(stacked_steps(model, prompts, args.steps))
            p, s = statistics.median(padded) * 1e3, statistics.median(stacked) * 1e3
            print(f"{name:<12} {p:>15.2f} {s:>20.2f} {s / p:>15.2f}x")


if __name__ == "__main__":
    main()
