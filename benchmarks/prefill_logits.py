"""Benchmark: a prompt's prefill with logits for every position vs for the last one only.

`generate` asks `CausalLM.forward(..., logits_to_keep=1)`; this times one forward over a prompt of
--prompt tokens on a GPT-2-124M-shaped model (random weights) both ways, rounds interleaved, and
prints the medians and their ratio.

    python benchmarks/prefill_logits.py --prompt 256 --rounds 3 --threads 1
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
from handformer.models.causal_lm import CausalLM  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = CausalLMConfig.gpt2_style(vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12,
                                    max_positions=max(1024, args.prompt))
    model = CausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, args.prompt))
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.no_grad():
        model(ids[:, :8])  # warm-up
        for _ in range(args.rounds):
            for last_only in (False, True):
                start = time.perf_counter()
                model(ids, logits_to_keep=int(last_only))  # 0: every position, 1: the last
                times[last_only].append(time.perf_counter() - start)
    full, last = statistics.median(times[False]), statistics.median(times[True])
    print(f"{torch.get_num_threads()} threads, {args.prompt}-token prompt, medians of {args.rounds} "
          f"interleaved rounds: all logits {full:.3f} s, last position only {last:.3f} s "
          f"({full / last:.2f}x)")


if __name__ == "__main__":
    main()
