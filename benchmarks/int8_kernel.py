"""Benchmark: which kernel runs `Int8Linear` (handformer/inference/quant.py) fastest here, and int4.

For the linear layers of a GPT-2-124M-shaped model (D = 768, and the 50,257-row output head), times
y = x W^T at decode-time row counts (M = 1 and 8) three ways, rounds interleaved, medians reported:

- fp32:     F.linear on the float weight (the baseline);
- int8pack: torch.ops.aten._weight_int8pack_mm on the int8 weight and per-row scales, fp32
  activations (in torch 2.13 this dtype takes a scalar fallback loop);
- int8pack-bf16: the same kernel with the activations and scales cast to bf16 and the result cast
  back to fp32 (the dtype its vectorized AVX512 path serves);
- dequant:  the int8 weight times its scales back to fp32, then F.linear;
- int4-bf16: 4-bit weights in groups of 32 (inference/quant_int4.py) through
  torch.ops.aten._weight_int4pack_mm_for_cpu with bf16 activations, for comparison;
- c-fp32: Int8Linear's opt-in C kernel (handformer/inference/c_kernels.py: each int8 weight widened to
  fp32 in AVX-512 registers, fp32 activations and sums, output rows split among the threads), built
  with gcc at first use; left out, with the reason, where gcc or AVX-512 is missing;
- vnni, int4-vnni: the VNNI kernels (handformer/inference/vnni_matvec.c: the activation rows rounded
  to int8 in blocks of 32, integer dots by vpdpbusd) on the int8 weight and on the weight in Q4_0's
  int4 form (groups of 32, float16 scales, zeros 0); left out, with the reason, without VNNI.

For M = 1 it also prints the GB/s of weight bytes each kernel reads (4, 1, 0.625 and, for int4-vnni,
0.5625 bytes a weight).

    python benchmarks/int8_kernel.py              # about 20 s on 2 busy cores
    python benchmarks/int8_kernel.py --rounds 9 --threads 1

Prints each layer's time per call in microseconds and the ratio fp32 / kernel (> 1 = faster than fp32).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handformer.inference import c_kernels  # noqa: E402
from handformer.inference.quant import dequantize_int8, quantize_int8  # noqa: E402
from handformer.inference.quant_int4 import Int4Linear  # noqa: E402

SHAPES = {"qkv 768->2304": (2304, 768), "o_proj 768->768": (768, 768), "up 768->3072": (3072, 768),
          "down 3072->768": (768, 3072), "head 768->50257": (50257, 768)}


def per_call(fn: Callable[[], torch.Tensor], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def vnni_kernels(x: torch.Tensor, w: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> dict:
    """The VNNI kernels' calls where the CPU has them: int8 on q, int4 on w in Q4_0's form (groups of
    32, zeros 0, float16 scales)."""
    if c_kernels.kernel("int8_vnni_linear") is None:
        return {}
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w
    int4 = Int4Linear.from_linear(linear, 32, kernel="vnni")
    int4.scales.copy_(int4.scales.half().float())
    int4.zeros.zero_()
    weights = c_kernels.pointers(q, scales, None)
    return {"vnni": lambda: c_kernels.vnni_linear("int8_vnni_linear", x, weights, w.shape[0]),
            "int4-vnni": lambda: int4(x)}


def make_kernels(x: torch.Tensor, w: torch.Tensor, q: torch.Tensor, scales: torch.Tensor,
                 c: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """The ways to compute x W^T, as calls without arguments (c-fp32 when `c` is given)."""
    scales_bf16 = scales.to(torch.bfloat16)
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight.data = w
    int4 = Int4Linear.from_linear(linear, 32)
    return {
        "fp32": lambda: F.linear(x, w),
        "int8pack": lambda: torch.ops.aten._weight_int8pack_mm(x, q, scales),
        "int8pack-bf16": lambda: torch.ops.aten._weight_int8pack_mm(
            x.to(torch.bfloat16), q, scales_bf16).float(),
        "dequant": lambda: F.linear(x, dequantize_int8(q, scales)),
        "int4-bf16": lambda: int4(x),
        **({"c-fp32": lambda: c_kernels.int8_linear(x, q, scales)} if c else {}),
        **vnni_kernels(x, w, q, scales),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} interleaved "
          "rounds, medians (the machine may be shared: figures are noisy)")
    print(f"torch CPU capability: {torch.backends.cpu.get_cpu_capability()}")
    c = c_kernels.kernel() is not None
    if not c:
        print(f"c-fp32 left out: {c_kernels.why_not()}")
    vnni = c_kernels.kernel("int8_vnni_linear") is not None
    if not vnni:
        print(f"vnni and int4-vnni left out: {c_kernels.why_not('int8_vnni_linear')}")
    names = (("fp32", "int8pack", "int8pack-bf16", "dequant", "int4-bf16") + (("c-fp32",) if c else ())
             + (("vnni", "int4-vnni") if vnni else ()))
    weight_bytes = {"fp32": 4, "int8pack": 1, "int8pack-bf16": 1, "dequant": 1, "int4-bf16": 0.625,
                    "c-fp32": 1, "vnni": 1, "int4-vnni": 18 / 32}
    print(f"{'layer':18} {'M':>3} " + " ".join(f"{n + ' us':>17}" for n in names) + "   fp32 / each kernel")
    torch.manual_seed(0)
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k) * 0.02
        q, scales = quantize_int8(w)
        calls = 3 if n > 10000 else 30
        for m in (1, 8):
            x = torch.randn(m, k)
            kernels = make_kernels(x, w, q, scales, c)
            if c:
                exact = x @ dequantize_int8(q, scales).T
                assert torch.allclose(kernels["c-fp32"](), exact, rtol=1e-4, atol=1e-4), name
            times: dict[str, list[float]] = {k_: [] for k_ in kernels}
            for fn in kernels.values():
                fn()  # warm-up
            for _ in range(args.rounds):
                for key, fn in kernels.items():
                    times[key].append(per_call(fn, calls))
            med = {key: statistics.median(v) * 1e6 for key, v in times.items()}
            print(f"{name:18} {m:>3} " + " ".join(f"{med[n]:>17.0f}" for n in names) + "   "
                  + " ".join(f"{med['fp32'] / med[n]:.2f}x" for n in names[1:]))
            if m == 1:
                print(f"{'':18} {'GB/s':>3} " + " ".join(f"{n * k * weight_bytes[x] / med[x] / 1e3:>17.1f}"
                                                       for x in names))


if __name__ == "__main__":
    main()
