"""Benchmark: the fused decoding step's thread rule (`StepThreads`) against the same step held at
torch's thread count, in one process, one arm after the other.

Both arms run the same prepared GPT-2-124M-shaped model (random weights, seed 0), the same prompt,
token count and threads; only the object that picks each step's threads differs (`step.pace`, the
rule or a pace that always answers torch's count). Each arm keeps its pace across its calls, as one
process decoding call after call does. Rounds alternate (A B, B A, ...) after one warm-up call of
each; nothing else runs in the process meanwhile. For each round: tokens/s of each arm and how many
of the rule's steps ran on one thread and on the team.

--busy CORE starts a busy loop (a second process, `taskset -c CORE`) for the whole run: a neighbour
holding one core. --log prints the rule's every step (threads, milliseconds, reference, state) of
the last round, to see what it decided and why.

    python benchmarks/step_threads_ab.py --threads 2 --rounds 6
    python benchmarks/step_threads_ab.py --threads 2 --rounds 4 --busy 0
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.inference.fused_step import fused_step_for  # noqa: E402
from handformer.inference.prepare import prepare_for_decoding  # noqa: E402
from handformer.inference.threads import StepThreads  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402


class Recorded(StepThreads):
    """The rule, its every step written down: (threads, seconds, reference, alone) a step."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[int, float, float, bool]] = []

    def record(self, threads: int, seconds: float) -> None:
        super().record(threads, seconds)
        self.steps.append((threads, seconds, self.reference, self.alone))


class Held(Recorded):
    """The step held at torch's thread count: never one thread unless torch's count is one."""

    def choose(self, wanted: int) -> int:
        return wanted


def busy_loop(core: int) -> subprocess.Popen:
    """A process spinning on `core` until killed."""
    return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--busy", type=int, default=None, help="a core to keep busy during the run")
    parser.add_argument("--log", action="store_true", help="print the rule's steps of the last round")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = CausalLMConfig.gpt2_style(vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12,
                                    max_positions=2048, dropout=0.0)
    model = prepare_for_decoding(CausalLM(cfg).eval())
    prompt = torch.randint(0, cfg.vocab_size, (args.prompt,)).tolist()
    step = fused_step_for(model)
    if step is None:
        raise SystemExit("no fused step for this model here (no C compiler?): nothing to compare")
    paces = {"rule": Recorded(), "held": Held()}
    loop = busy_loop(args.busy) if args.busy is not None else None
    try:
        results = run(model, prompt, step, paces, args)
    finally:
        if loop is not None:
            loop.kill()
    report(results, args)
    if args.log:
        log(paces["rule"])


def run(model, prompt, step, paces, args) -> dict[str, list[tuple[float, int, int, list[int]]]]:
    """Each arm's (seconds, one-thread steps, team steps, tokens) of every round."""
    n = args.new_tokens

    def call(arm: str) -> tuple[float, int, int, list[int]]:
        step.pace = pace = paces[arm]
        first = len(pace.steps)
        start = time.perf_counter()
        with torch.inference_mode():
            tokens = generate(model, [prompt], n, temperature=0)[0]
        seconds = time.perf_counter() - start
        ran = [t for t, *_ in pace.steps[first:]]
        return seconds, ran.count(1), len(ran) - ran.count(1), tokens

    for arm in paces:
        call(arm)  # warm-up
    results: dict[str, list[tuple[float, int, int, list[int]]]] = {arm: [] for arm in paces}
    for r in range(args.rounds):
        for arm in (reversed if r % 2 else list)(list(paces)):
            results[arm].append(call(arm))
    return results


def report(results, args) -> None:
    n = args.new_tokens
    load = Path("/proc/loadavg").read_text().split()[0]
    print(f"torch {torch.__version__}, {args.threads} threads, prompt {args.prompt}, {n} new tokens, "
          f"busy core {args.busy}, load average {load} after")
    print("round  rule tok/s (one thread / team steps)  held tok/s (team steps)  rule / held")
    for r, (a, b) in enumerate(zip(results["rule"], results["held"])):
        print(f"{r:5}  {n / a[0]:10.1f} ({a[1]:3} / {a[2]:3}){'':18} {n / b[0]:9.1f} ({b[2]:3}){'':12}"
              f"{b[0] / a[0]:6.3f}x")
    med = {arm: statistics.median(s for s, *_ in rows) for arm, rows in results.items()}
    ones = sum(a[1] for a in results["rule"])
    team = sum(a[2] for a in results["rule"])
    same = all(a[3] == b[3] for a, b in zip(results["rule"], results["held"]))
    print(f"median: rule {n / med['rule']:.1f} tok/s, held {n / med['held']:.1f} tok/s, rule / held "
          f"{med['held'] / med['rule']:.3f}x; the rule's steps: {ones} on one thread, {team} on the team; "
          f"tokens the same: {same}")


def log(pace: Recorded) -> None:
    print("the rule's steps (all rounds): threads ms reference-ms alone")
    for i, (threads, seconds, reference, alone) in enumerate(pace.steps):
        print(f"{i:5} {threads} {seconds * 1e3:7.2f} {reference * 1e3:7.2f} {int(alone)}")


if __name__ == "__main__":
    main()
