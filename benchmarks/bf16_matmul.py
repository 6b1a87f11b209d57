"""Benchmark: a square matmul in fp32 vs bf16 on this CPU, side by side in one run.

Why it exists: on CPUs without bf16 matrix units (AMX, AVX512-BF16), PyTorch's bf16 matmul falls
back to generic code, so `train.bf16 = true` makes training far slower, not faster; the README's
figure and the warning in handformer/training/loop.py come from this script.

Rounds are interleaved (fp32, bf16, fp32, bf16, ...) so that load from other processes hits both
alike; each round times `--repeats` matmuls, and the medians over rounds are compared.

    python benchmarks/bf16_matmul.py                      # 512 x 512, 5 rounds (seconds)
    python benchmarks/bf16_matmul.py --size 1024 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return "unknown"
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    return " ".join(f for f in wanted if f" {f}" in flags) or "none of avx2/avx512/amx"


def time_matmul(a: torch.Tensor, b: torch.Tensor, repeats: int) -> float:
    """Seconds per matmul, over `repeats` back-to-back products."""
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=512, help="matrix side N (N x N times N x N)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    parser.add_argument("--repeats", type=int, default=3, help="matmuls timed per round and dtype")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    a32 = torch.randn(args.size, args.size, generator=g)
    b32 = torch.randn(args.size, args.size, generator=g)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    time_matmul(a32, b32, 1)  # warm-up: first-call dispatch and page faults
    time_matmul(a16, b16, 1)
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for _ in range(args.rounds):
        times["fp32"].append(time_matmul(a32, b32, args.repeats))
        times["bf16"].append(time_matmul(a16, b16, args.repeats))
    flops = 2 * args.size**3
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU flags: {cpu_flags()}")
    print(f"{args.size} x {args.size} matmul, {args.rounds} interleaved rounds of {args.repeats}:")
    med = {k: statistics.median(v) for k, v in times.items()}
    for name in ("fp32", "bf16"):
        print(f"  {name}: median {1e3 * med[name]:9.2f} ms  ({flops / med[name] / 1e9:7.1f} GFLOP/s; "
              f"rounds {', '.join(f'{1e3 * t:.2f}' for t in times[name])} ms)")
    print(f"bf16 / fp32 time: {med['bf16'] / med['fp32']:.1f}x")


if __name__ == "__main__":
    main()
