"""Benchmark: oneDNN-packed linear layers (handformer/inference/packed_linear.py) against `F.linear`.

Every linear layer of a GPT-2-124M-shaped model (12 x (Q/K/V 2304 x 768, O 768 x 768, FFN 3072 x 768
and 768 x 3072), head 50,257 x 768; random weights, 497 MB in fp32, far larger than the caches),
applied once each to M rows (M = 1: a decoding step at batch 1), as `F.linear` (MKL on x86) and as
`PackedLinear`, in fp32 and bf16, beside a streaming read of the same number of bytes (a sum).
Prints milliseconds per pass, GB/s of weights read and the ratio; medians of --rounds interleaved
rounds.

    python benchmarks/packed_linear.py                  # torch's thread count
    python benchmarks/packed_linear.py --threads 1 --rows 1 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handformer.inference.packed_linear import PackedLinear, packing_available  # noqa: E402

D, LAYERS, VOCAB = 768, 12, 50257


def shapes() -> list[tuple[int, int]]:
    """(out, in) of every linear layer of GPT-2-124M, then its head."""
    return [(3 * D, D), (D, D), (4 * D, D), (D, 4 * D)] * LAYERS + [(VOCAB, D)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if not packing_available():
        raise SystemExit("this torch has no oneDNN linear packing (torch.backends.mkldnn)")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    linears = [nn.Linear(k, n, bias=False).eval() for n, k in shapes()]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; medians of {args.rounds} interleaved rounds")
    for dtype in (torch.float32, torch.bfloat16):
        plain = [linear.to(dtype) for linear in linears]
        packed = [PackedLinear.from_linear(linear) for linear in plain]
        weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in plain)
        data = torch.ones(weight_bytes // 4)  # the same bytes, for the streaming read
        for rows in args.rows:
            inputs = [torch.randn(rows, m.in_features, dtype=dtype) for m in plain]

            def run(layers: list[nn.Module], inputs: list[torch.Tensor] = inputs) -> float:
                start = time.perf_counter()
                with torch.inference_mode():
                    for layer, x in zip(layers, inputs):
                        layer(x) if isinstance(layer, PackedLinear) else F.linear(x, layer.weight)
                return time.perf_counter() - start

            times: dict[str, list[float]] = {"F.linear": [], "packed": [], "read": []}
            run(plain), run(packed)  # warm-up
            for _ in range(args.rounds):
                times["F.linear"].append(run(plain))
                times["packed"].append(run(packed))
                start = time.perf_counter()
                data.sum()
                times["read"].append(time.perf_counter() - start)
            med = {k: statistics.median(v) for k, v in times.items()}
            gbs = {k: weight_bytes / v / 1e9 for k, v in med.items()}
            name = str(dtype).removeprefix("torch.")
            print(f"{name:8} M={rows:<3} F.linear {med['F.linear'] * 1e3:7.2f} ms "
                  f"({gbs['F.linear']:5.1f} GB/s)  packed {med['packed'] * 1e3:7.2f} ms "
                  f"({gbs['packed']:5.1f} GB/s)  "
                  f"{med['F.linear'] / med['packed']:.2f}x;  streaming read {gbs['read']:.1f} GB/s")
        for linear in linears:
            linear.float()


if __name__ == "__main__":
    main()
