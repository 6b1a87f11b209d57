"""Benchmark: what AMX (Intel's tile matrix units) gives the products of a prompt or a batch, beside
the kernels handformer runs today, at GPT-2-124M's layer shapes.

For M rows of activations (8: a batch; 1,024: a long prompt's prefill) times each layer's weight:

- fp32 packed: `PackedLinear` (oneDNN's packed fp32 product), what a prepared fp32 model runs for
  more than two rows;
- bf16 packed: `PackedLinear` on the weight in bf16, bf16 activations (oneDNN; on a CPU with
  AMX-BF16 its brgemm kernel runs on the tiles: `ONEDNN_VERBOSE=1` prints `brg_matmul:..._amx`);
- int8 vnni: `Int8Linear` with its default kernel ("auto": vnni_matvec.c where the CPU has AVX-512
  VNNI, for any number of rows);
- int8 via bf16: the int8 weight widened to bf16 at each call (its values -127..127 exactly), the
  bf16 product, then the per-channel scales in fp32: AMX-BF16 for an int8 layer, no copy kept;
- int8 _int_mm: the rows rounded to int8 with a scale each, `torch._int_mm` (oneDNN's s8 x s8 ->
  s32), then both scales.

Each case's error is max |y - y_fp32| / max |y_fp32| against the fp32 product. Rounds interleaved
(every other one reversed), medians, microseconds a call.

    python benchmarks/amx_matmul.py --threads 1 --rounds 5     # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handformer.inference.packed_linear import PackedLinear  # noqa: E402
from handformer.inference.quant import Int8Linear  # noqa: E402

SHAPES = {"qkv 768->2304": (2304, 768), "o_proj 768->768": (768, 768), "up 768->3072": (3072, 768),
          "down 3072->768": (768, 3072)}


def int8_via_bf16(layer: Int8Linear) -> Callable[[Tensor], Tensor]:
    """The int8 layer's product through a bf16 copy of its weight made at each call."""
    def run(x: Tensor) -> Tensor:
        y = nn.functional.linear(x.bfloat16(), layer.weight.bfloat16())  # (M, N)
        return y.float() * layer.scales + layer.bias
    return run


def int8_int_mm(layer: Int8Linear) -> Callable[[Tensor], Tensor]:
    """The int8 layer's product with the rows rounded to int8 (a scale a row) and torch._int_mm."""
    weight_t = layer.weight.t().contiguous()  # (K, N)

    def run(x: Tensor) -> Tensor:
        scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127  # (M, 1)
        rows = torch.round(x / scale).to(torch.int8)
        return torch._int_mm(rows, weight_t).float() * scale * layer.scales + layer.bias
    return run


def cases_for(linear: nn.Linear, x: Tensor) -> dict[str, Callable[[], Tensor]]:
    fp32 = PackedLinear.from_linear(linear).eval()
    bf16 = PackedLinear(linear.weight.bfloat16(), linear.bias.bfloat16()).eval()
    int8 = Int8Linear.from_linear(linear).eval()
    x_bf16 = x.bfloat16()
    via_bf16, int_mm = int8_via_bf16(int8), int8_int_mm(int8)
    return {"fp32 packed": lambda: fp32(x), "bf16 packed": lambda: bf16(x_bf16).float(),
            "int8 vnni": lambda: int8(x), "int8 via bf16": lambda: via_bf16(x),
            "int8 _int_mm": lambda: int_mm(x)}


def medians(cases: dict[str, Callable[[], Tensor]], rounds: int, calls: int) -> dict[str, float]:
    """Seconds a call of each case, the median of interleaved rounds (after one warm-up call each)."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(rounds):
        for name, fn in (reversed if r % 2 else list)(list(cases.items())):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 1024])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"{args.threads} threads, torch {torch.__version__}, medians of {args.rounds} rounds, us a call "
          f"(x fp32 packed's speed; error against fp32)")
    with torch.inference_mode():
        for M in args.rows:
            for name, (N, K) in SHAPES.items():
                linear, x = nn.Linear(K, N).eval(), torch.randn(M, K)
                cases = cases_for(linear, x)
                exact = linear(x)
                error = {c: float((fn() - exact).abs().max() / exact.abs().max()) for c, fn in cases.items()}
                t = medians(cases, args.rounds, 20 if M <= 64 else 2)
                base = t["fp32 packed"]
                cells = [f"{c} {t[c] * 1e6:,.0f} ({base / t[c]:.2f}x, {error[c]:.0e})" for c in cases]
                print(f"M={M:<5} {name:<16} " + " | ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
