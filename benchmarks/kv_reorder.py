"""Benchmark: `DecodingCache.reorder` (beam search's per-step row selection), copying only the filled
positions and leaving the shared cross-attention keys/values alone, against selecting the whole
preallocated buffers (self and cross).

A beam search's caches: --sentences x --beam rows, --layers decoder layers of --heads x --head-dim,
capacity --steps positions, a --source-long source; one reorder per step as the cache fills.
Medians of --rounds interleaved rounds.

    python benchmarks/kv_reorder.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handformer.generation.cache import DecodingCache  # noqa: E402
from handformer.nn.kv_cache import KVCache  # noqa: E402


def whole_buffers(cache: KVCache, index: torch.Tensor) -> None:
    """The simple reorder: every preallocated buffer selected in full, cross included."""
    for store in (cache.keys, cache.values):
        for i, t in enumerate(store):
            store[i] = t.index_select(0, index)
    for i, (k, v) in enumerate(cache.cross):
        cache.cross[i] = (k.index_select(0, index), v.index_select(0, index))


def beam_steps(reorder, args: argparse.Namespace) -> float:
    """Seconds of the reorders over one search that fills the cache one position per step."""
    rows = args.sentences * args.beam
    cache = DecodingCache(args.layers, args.steps)
    kv = torch.randn(rows, args.heads, 1, args.head_dim)
    source = torch.randn(rows, args.heads, args.source, args.head_dim)
    for i in range(args.layers):
        cache.cross[i] = (source.clone(), source.clone())
    gen = torch.Generator().manual_seed(0)
    spent = 0.0
    for _ in range(args.steps):
        for i in range(args.layers):
            cache.layer(i).update(kv, kv)
        cache.advance(1)
        # each sentence keeps K of its own beams
        index = (torch.randint(0, args.beam, (args.sentences, args.beam), generator=gen)
                 + torch.arange(args.sentences)[:, None] * args.beam).view(-1)  # (rows,)
        start = time.perf_counter()
        reorder(cache, index)
        spent += time.perf_counter() - start
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--source", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cases = {"whole buffers, cross too (before)": whole_buffers,
             "filled positions, no cross (now)": lambda c, i: c.reorder(i, cross=False)}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            times[name].append(beam_steps(fn, args))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.sentences} x beam "
          f"{args.beam}, {args.layers} layers, {args.steps} steps; medians of {args.rounds} rounds")
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, m in med.items():
        print(f"  {name:36} {m * 1e3:8.1f} ms per search ({m / args.steps * 1e6:.0f} us a step)")
    before, now = med.values()
    print(f"  speed-up: {before / now:.2f}x")


if __name__ == "__main__":
    main()
