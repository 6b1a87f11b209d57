"""Benchmark: decoding speed of a real llama2.c checkpoint (stories260K) in handformer, side by side
with Hugging Face's LlamaForCausalLM on the same weights and, when given, llama2.c's own run.c.

Each round, in turn (rounds interleaved, medians reported, because this machine's CPU is shared):
- handformer: `generate` with its KV cache, greedy, from BOS, 256 new tokens (stop tokens off so
  every round decodes 256); the time covers the whole call (prefill of the 1-token prompt and
  every step), not loading the run; the run loaded as `handformer generate` loads it (prepared for
  decoding: here the fused C step of inference/fused_step.py) and, as "as loaded", the lesson's
  modules as `load_lm` gives them;
- transformers: `generate(do_sample=False, min_new_tokens=256, max_new_tokens=256)`, the same
  weights (the run exported with `handformer export-hf`), its cache on;
- run.c (with --run-c PATH, a binary built from karpathy/llama2.c outside this project):
  `run MODEL -z TOKENIZER -t 0 -n 257`; its own "achieved tok/s" (timed from the second token).
The tokens of handformer and transformers are compared. Threads are matched: handformer and
transformers share this process's `--threads` torch threads; run.c gets OMP_NUM_THREADS=--threads
(a plain `make run` build is single-threaded whatever it is given: pass `--threads 1` beside it,
or build `make runomp`). Each line has tokens/s, the bandwidth bound and MBU
(handformer/inference/roofline.py); stories260K's 1 MB of weights sit in the cache, so the bound
means little (MBU is a few percent: each step is operator overhead) and run.c is the yardstick.

Target of the project: 256 tokens in at most 0.5 s (start-up aside).

    python benchmarks/llama2c_decode.py                       # 7 rounds, 1 thread
    python benchmarks/llama2c_decode.py --run-c /tmp/llama2.c/run --threads 2

Reads the stories260K dataset (docs/data.md: where it is looked for); needs `transformers`.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.data.lookup import folder  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.inference.roofline import bound, read_bandwidth, roofline_line  # noqa: E402
from handformer.tasks.lm.exports import export_hf  # noqa: E402
from handformer.tasks.lm.imports import import_llama2c  # noqa: E402
from handformer.tasks.lm.run import LMRun, load_lm  # noqa: E402

N_NEW = 256


def hf_model(run_dir: Path) -> torch.nn.Module:
    """transformers' LlamaForCausalLM with the run's weights, written by `handformer export-hf`."""
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        export_hf(run_dir, tmp, overwrite=True)
        return transformers.LlamaForCausalLM.from_pretrained(tmp).eval()


def time_handformer(run: LMRun) -> tuple[float, list[int]]:
    start = time.perf_counter()
    out = generate(run.model, [[1]], N_NEW, temperature=0)[0]
    return time.perf_counter() - start, out


def time_hf(hf: torch.nn.Module) -> tuple[float, list[int]]:
    ids = torch.tensor([[1]])
    with torch.no_grad():
        start = time.perf_counter()
        out = hf.generate(ids, do_sample=False, min_new_tokens=N_NEW, max_new_tokens=N_NEW,
                          pad_token_id=0, eos_token_id=None)
        seconds = time.perf_counter() - start
    return seconds, out[0, 1:].tolist()


def time_run_c(binary: str, threads: int) -> float:
    """Seconds for 256 tokens at run.c's own reported rate, on `threads` OpenMP threads."""
    data = folder("stories260K")
    out = subprocess.run([binary, str(data / "stories260K.bin"), "-z", str(data / "tok512.bin"), "-t", "0",
                          "-n", str(N_NEW + 1)], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    rate = float(re.search(r"achieved tok/s: ([0-9.]+)", out.stderr).group(1))
    return N_NEW / rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--run-c", default=None, help="path to a run binary built from karpathy/llama2.c")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        import_llama2c(folder("stories260K") / "stories260K.bin", folder("stories260K") / "tok512.bin",
                      Path(tmp) / "run")
        run = load_lm(Path(tmp) / "run", decoding=True)  # as `handformer generate` runs it
        loaded = load_lm(Path(tmp) / "run")
        hf = hf_model(Path(tmp) / "run")
    time_handformer(run), time_handformer(loaded), time_hf(hf)  # warm-up
    times: dict[str, list[float]] = {"handformer": [], "as loaded": [], "transformers": [], "run.c": []}
    same = True
    for _ in range(args.rounds):
        seconds, ours = time_handformer(run)
        times["handformer"].append(seconds)
        seconds, plain = time_handformer(loaded)
        times["as loaded"].append(seconds)
        same &= ours == plain
        seconds, theirs = time_hf(hf)
        times["transformers"].append(seconds)
        same &= ours == theirs
        if args.run_c:
            times["run.c"].append(time_run_c(args.run_c, args.threads))
    print(f"stories260K, greedy, {N_NEW} new tokens from BOS, batch 1, {torch.get_num_threads()} "
          f"thread(s) for every side (run.c: OMP_NUM_THREADS={args.threads}), "
          f"{args.rounds} interleaved rounds (medians; the CPU is shared, so rounds vary)")
    base = statistics.median(times["handformer"])
    limit = bound(read_bandwidth(args.threads), run.model, 1 + N_NEW / 2)  # in the cache: means little
    for name, values in times.items():
        if values:
            median = statistics.median(values)
            rounds = ", ".join(f"{v:.3f}" for v in values)
            print(f"  {name:12s} {median:7.3f} s  {roofline_line(N_NEW / median, limit)}  time = "
                  f"{median / base:5.2f}x handformer's  rounds: {rounds}")
    print(f"  target: <= 0.5 s -> {'met' if base <= 0.5 else 'NOT met'}; "
          f"handformer (prepared and as loaded) and transformers tokens {'equal' if same else 'DIFFER'}")
    if times["run.c"]:
        ratio = statistics.median(times["run.c"]) / base
        print(f"  handformer / run.c tokens/s: {ratio:.3f}x (target >= 0.5x)")


if __name__ == "__main__":
    main()
