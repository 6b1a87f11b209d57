"""Profile: where a decoding step's time goes, handformer and Hugging Face side by side.

For a model shape of benchmarks/decode_limit.py and a batch of left-padded prompts (batch 1: one
64-token prompt), runs `generate` and HF `generate` (greedy, --new-tokens tokens) under
torch.profiler and prints, for each, per decoding step (a run of --new-tokens tokens less a run of
one token, the prompt's forward: the prefill is not a step): milliseconds (unprofiled, medians of 3,
and under the profiler, whose cost per operator call is large for a small model), the share of the
operators' time spent in matrix products (aten::mm / addmm / bmm: the weights' GEMV or GEMM), in
attention (the SDPA kernels) and in everything else (norms, activations, masks, copies, sampling),
operator calls, and the operators' time against the profiled wall clock (the rest is Python).
Both sides run at --threads (default: torch's setting).

    python benchmarks/decode_profile.py --model gpt2-124M --batch 8
    python benchmarks/decode_profile.py --model tiny --threads 1 --unfused   # Q/K/V, gate/up apart

The model is prepared as `handformer generate` runs it: `prepare_for_decoding` (projections fused by
handformer/inference/fuse.py, large weights packed for oneDNN); --unfused packs only; --int8
quantizes every linear layer and the head first (handformer/inference/quant.py); --compile
profiles the compiled decoding step (inference/static_step.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decode_limit import SHAPES, hf_generate, hf_twin  # noqa: E402

from handformer.generation.generate import generate  # noqa: E402
from handformer.inference.packed_linear import pack_linears  # noqa: E402
from handformer.inference.prepare import prepare_for_decoding  # noqa: E402
from handformer.inference.quant import quantize_linears  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int8pack_mm", "mkldnn::_linear_pointwise",
          "aten::_weight_int4pack_mm_for_cpu")
ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math")


def profiled(run, n: int) -> tuple[float, dict[str, tuple[float, int]], object]:
    """Wall seconds of run(n) under the profiler, each operator's (self microseconds, calls), the profile."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        run(n)
        wall = time.perf_counter() - start
    return wall, {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}, prof


def shares(run, steps: int, top: int = 0) -> str:
    """The decoding steps alone: every figure of a run of `steps` steps less the same run's prefill
    (run(1): the prompt's forward and the first token), per step."""
    run(2)  # warm-up
    prefill_wall, prefill_ops, _ = profiled(run, 1)
    wall, ops, prof = profiled(run, steps + 1)
    if top:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))
    step_ops = {k: (t - prefill_ops.get(k, (0, 0))[0], c - prefill_ops.get(k, (0, 0))[1])
                for k, (t, c) in ops.items()}
    total = sum(t for t, _ in step_ops.values())
    matmul = sum(t for k, (t, _) in step_ops.items() if k in MATMUL)
    attention = sum(t for k, (t, _) in step_ops.items() if k in ATTENTION)
    calls = sum(c for _, c in step_ops.values()) / steps
    profiled_step = (wall - prefill_wall) / steps
    # unprofiled, medians of 3: the profiler's own cost per operator call is left out
    per_step = (statistics.median(timed(lambda: run(steps + 1)) for _ in range(3))
                - statistics.median(timed(lambda: run(1)) for _ in range(3))) / steps
    return (f"{per_step * 1e3:7.2f} ms a step ({profiled_step * 1e3:.2f} ms profiled); operators: matmul "
            f"{matmul / total:.0%}, attention {attention / total:.0%}, other "
            f"{1 - (matmul + attention) / total:.0%}; {calls:,.0f} operator calls a step (nested ones "
            f"included); operators {total / 1e6 / (wall - prefill_wall):.0%} of the wall clock (profiled)")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gpt2-124M", choices=list(SHAPES))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--top", type=int, default=0, help="also print the N most expensive operators")
    parser.add_argument("--unfused", action="store_true", help="leave Q/K/V and gate/up projections apart")
    parser.add_argument("--int8", action="store_true", help="int8 weights, head included (handformer only)")
    parser.add_argument("--compile", action="store_true", help="handformer's compiled step (compile_step)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = CausalLM(SHAPES[args.model]()).eval()
    hf = hf_twin(model)
    if args.int8:
        quantize_linears(model, bits=8)
    if args.unfused:  # large weights packed, projections apart
        pack_linears(model)
    else:  # as `handformer generate`: fused projections, large weights packed
        prepare_for_decoding(model)
    gen = torch.Generator().manual_seed(args.batch)
    lengths = [64] if args.batch == 1 else torch.randint(32, 65, (args.batch,), generator=gen).tolist()
    prompts = [torch.randint(0, model.cfg.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.model}, batch {args.batch}, "
          f"{args.new_tokens} new tokens; projections {'apart' if args.unfused else 'fused'}"
          f"{'; int8 weights' if args.int8 else ''}{'; compiled step' if args.compile else ''}")
    with torch.no_grad():
        def ours(n: int) -> list[list[int]]:
            return generate(model, prompts, n, temperature=0, compile_step=args.compile, threads=None)

        print("  handformer:", shares(ours, args.new_tokens, args.top))
        print("  HF generate:", shares(lambda n: hf_generate(hf, prompts, n), args.new_tokens, args.top))


if __name__ == "__main__":
    main()
