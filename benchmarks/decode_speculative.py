"""Benchmark: speculative decoding with prompt lookup (no draft model) beside plain decoding, in one run.

A GPT-2-124M-shaped model (12 layers, 768 wide, 12 heads, vocab 50,257, tied head) with RANDOM
weights (the model's own initialisation, seed 0; no trained GPT-2 is on the machine), prepared as
`handformer generate` prepares a run, greedy, batch 1, on two prompts:

- repetitive: a 48-token passage quoted four times (as code repeats its identifiers, or a reply
  quotes a document), then its first 16 tokens again;
- varied: 208 random tokens (nothing repeats: prompt lookup finds few drafts, the cost side).

For each: plain `generate` and `generate(speculate=Speculation())` (prompt lookup, up to K = 7
guesses a step, fewer after a rejection: `DraftLength`), its guesses checked by the fused C step (one
step over the newest token and the K guesses, each weight read once), with K fixed at 4 (every step
drafts 4: "fixed K=4", `--fixed`) and, as where that step cannot be built, checked by the model's own
forward ("eager check"), the same threads,
interleaved rounds (every other one in reverse order) after a warm-up call, medians; the tokens must
be identical (exit status 1 otherwise); the acceptance rate; tokens/s, the bandwidth bound and MBU
(handformer/inference/roofline.py) of plain decoding.

A random model's greedy continuation settles into a short cycle of tokens, which prompt lookup
drafts from the context once it has been seen: the acceptance rate here is that of such a
continuation, not of a trained model on real text (which copies a quoted passage instead).

With --draft-layers N, also a draft model (`Speculation(draft_model=...)`): the model's first N
layers with its own embedding, final norm and head (the same vocabulary; a random model has no
smaller trained sibling), prepared the same way, drafting K tokens a check.

    python benchmarks/decode_speculative.py --threads 1     # ~3 min on 2 cores
    python benchmarks/decode_speculative.py --threads 1 --draft-layers 2
    python benchmarks/decode_speculative.py --threads 1 --check-costs   # and a check's cost by T
    python benchmarks/decode_speculative.py --rounds 1 --new-tokens 16 --layers 2   # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.generation.engine import Engine, Row  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.generation.sampling import SamplingOptions, Speculation, greedy  # noqa: E402
from handformer.generation.speculative import DraftLength, SpeculationStats  # noqa: E402
from handformer.inference import fused_step  # noqa: E402
from handformer.inference.prepare import prepare_for_decoding  # noqa: E402
from handformer.inference.roofline import bound, read_bandwidth, roofline_line  # noqa: E402
from handformer.inference.threads import default_threads, intra_op_threads  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402


def prompts(vocab: int) -> dict[str, list[int]]:
    g = torch.Generator().manual_seed(1)
    passage = torch.randint(0, vocab, (48,), generator=g).tolist()
    return {"repetitive": passage * 4 + passage[:16],
            "varied": torch.randint(0, vocab, (208,), generator=g).tolist()}


def timed_rounds(cases: dict, rounds: int) -> dict[str, tuple[float, list[int]]]:
    """Median seconds and the tokens of each case over interleaved rounds, after a warm-up call."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    out: dict[str, list[int]] = {}
    for r in range(rounds):
        for name, fn in (reversed if r % 2 else list)(list(cases.items())):
            start = time.perf_counter()
            out[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(t), out[name]) for name, t in times.items()}


@contextlib.contextmanager
def fixed_length() -> Iterator[None]:
    """Every speculative step drafts `Speculation.tokens` guesses (the draft length never changes)."""
    update = DraftLength.update
    DraftLength.update = lambda self, drafted, kept: None
    try:
        yield
    finally:
        DraftLength.update = update


@contextlib.contextmanager
def eager_check() -> Iterator[None]:
    """Speculation's check of its guesses by the model's own forward, as where the fused C step cannot
    be built (the one-token steps stay fused): the fused step then feeds one token at most."""
    rows = fused_step.MAX_ROWS
    fused_step.MAX_ROWS = 1
    try:
        yield
    finally:
        fused_step.MAX_ROWS = rows


def check_costs(model: CausalLM, prompt: list[int], threads: int, rounds: int) -> None:
    """What a check of T tokens costs against a one-token step: the fused step over T = 1 .. MAX_ROWS
    tokens after `prompt` (its logits' argmax included), each call timed alone, rounds interleaved."""
    engine = Engine(model)
    engine.add([Row(prompt, 2 * fused_step.MAX_ROWS, SamplingOptions(0))])  # room for MAX_ROWS more
    step, cache, length = engine.static, engine.cache, engine.cache.length
    sizes = range(1, fused_step.MAX_ROWS + 1)
    times: dict[int, list[float]] = {T: [] for T in sizes}
    with intra_op_threads(threads):
        for r in range(rounds + 1):
            for T in (reversed(sizes) if r % 2 else sizes):
                ids = torch.tensor([prompt[:T]])  # (1, T)
                assert step.usable(cache, None, T)
                start = time.perf_counter()
                greedy(step(ids, cache)).tolist()
                if r:  # round 0 warms up
                    times[T].append(time.perf_counter() - start)
                cache.truncate(length)
    ms = {T: statistics.median(times[T]) * 1e3 for T in sizes}
    print("fused check of T tokens after the repetitive prompt, ms (x a one-token step): "
          + ", ".join(f"{T}: {ms[T]:.2f} ({ms[T] / ms[1]:.2f}x)" for T in sizes))


def truncated(model: CausalLM, layers: int) -> CausalLM:
    """A draft model: `model`'s first `layers` layers, its embedding, final norm and head (`model`
    as built: preparing renames its weights)."""
    draft = CausalLM(dataclasses.replace(model.cfg, n_layers=layers)).eval()
    draft.load_state_dict(model.state_dict(), strict=False)  # the deeper layers' weights left out
    return prepare_for_decoding(draft)


def compare(model: CausalLM, name: str, prompt: list[int], args: argparse.Namespace, threads: int,
            bandwidth: float, draft: CausalLM | None = None) -> bool:
    """Plain and speculative decoding of one prompt (the guesses checked by the fused step, and by the
    model's forward; with `draft`, also drafted by it), timed side by side; whether the tokens agree."""
    stats, spec = SpeculationStats(), Speculation() if args.speculate is None else Speculation(args.speculate)
    drafted, fixed_stats, fixed = SpeculationStats(), SpeculationStats(), Speculation(tokens=args.fixed)

    def run(**speculation: object) -> list[int]:
        return generate(model, [prompt], args.new_tokens, temperature=0, threads=threads, **speculation)[0]

    def run_eager_check() -> list[int]:
        with eager_check():
            return run(speculate=spec)

    def run_fixed() -> list[int]:
        with fixed_length():
            return run(speculate=fixed, stats=fixed_stats)

    with torch.inference_mode():
        cases = {"plain": run, "speculative": lambda: run(speculate=spec, stats=stats),
                 f"fixed K={args.fixed}": run_fixed, "eager check": run_eager_check}
        if draft is not None:
            with_draft = Speculation(tokens=spec.tokens, draft_model=draft)
            cases["draft model"] = lambda: run(speculate=with_draft, stats=drafted)
        res = timed_rounds(cases, args.rounds)
    plain_s, plain_tokens = res["plain"]
    same = all(tokens == plain_tokens for _, tokens in res.values())
    limit = bound(bandwidth, model, len(prompt) + args.new_tokens / 2)
    print(f"\n{name} prompt ({len(prompt)} tokens):")
    print(f"  plain            {roofline_line(args.new_tokens / plain_s, limit)}")
    for case in [c for c in res if c != "plain"]:
        label = f"draft ({args.draft_layers} layers)" if case == "draft model" else case
        seconds = res[case][0]
        print(f"  {label:<17}{args.new_tokens / seconds:.1f} tokens/s ({plain_s / seconds:.2f}x plain, "
              f"K={args.fixed if case.startswith('fixed') else spec.tokens}), "
              f"tokens {'identical' if res[case][1] == plain_tokens else 'DIFFER'}")
    print(f"  {stats} (all {args.rounds + 1} calls)")
    print(f"  fixed K={args.fixed}: {fixed_stats} (all {args.rounds + 1} calls)")
    if draft is not None:
        print(f"  draft model: {drafted} (all {args.rounds + 1} calls)")
    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--speculate", type=int, default=None,
                        help="K: the most tokens drafted per forward (default: Speculation's)")
    parser.add_argument("--fixed", type=int, default=4, help="K of the case whose every step drafts K")
    parser.add_argument("--layers", type=int, default=12, help="12: GPT-2-124M's shape")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    parser.add_argument("--check-costs", action="store_true",
                        help="also time the fused step over 1 to 8 tokens (a check's cost against one step)")
    parser.add_argument("--draft-layers", type=int, default=None,
                        help="also draft with the model's first N layers (a draft model)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = CausalLMConfig.gpt2_style(vocab_size=50257, d_model=768, n_heads=12, d_ff=3072,
                                    n_layers=args.layers, max_positions=1024, dropout=0.0)
    model = CausalLM(cfg)
    draft = truncated(model, args.draft_layers) if args.draft_layers else None  # before preparing
    model = prepare_for_decoding(model)
    threads = default_threads(model) or torch.get_num_threads()
    bandwidth = read_bandwidth(threads)
    print(f"GPT-2-124M shape ({args.layers} layers), random weights, fp32, greedy, batch 1, "
          f"{args.new_tokens} new tokens, {threads} threads, torch {torch.__version__}, "
          f"read bandwidth {bandwidth / 1e9:.1f} GB/s")
    if args.check_costs and fused_step.fused_step_for(model) is not None:
        with torch.inference_mode():
            check_costs(model, prompts(cfg.vocab_size)["repetitive"], threads, 9)
    failed = False
    for name, prompt in prompts(cfg.vocab_size).items():
        failed |= not compare(model, name, prompt, args, threads, bandwidth, draft)
    print("\ntarget: prompt lookup on the repetitive prompt >= 1.5x plain, identical tokens")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
