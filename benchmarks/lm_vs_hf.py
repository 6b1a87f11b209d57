"""Benchmark: handformer's CausalLM vs Hugging Face transformers' GPT2LMHeadModel, side by side.

One run measures, on this machine:

1. the matmul peak, fp32 and bf16 (square matmuls, best of several), the denominator of MFU;
2. training throughput: the same GPT-2 config built twice (HF's model and handformer's, with HF's
   weights loaded into ours), trained in the same loop (same batches of random token ids, AdamW,
   clipping, the same loss function on the logits), rounds interleaved; tokens/s of each, their
   ratio, the final losses, and each one's model FLOPs utilization (6 N + 12 L T D flops a token);
3. generation throughput, greedy, batch 1: handformer with its KV cache, Hugging Face's
   `generate` (with its cache) on the same weights, and handformer without a cache, at 256 and
   1024 new tokens; tokens/s, ratios, and whether the tokens agree.

With --baseline DIR, another handformer checkout (`git worktree add DIR <commit>`) runs beside this
one in a worker process that imports only from DIR (benchmarks/baseline.py): its CausalLM, from the
same starting weights, trained in the same loop on the same batches inside the same interleaved
rounds, and its cached generation on this checkout's trained weights with the same prompt and thread
count; a table per section gives each pair's medians, their ratio and whether the final losses
(training) or the tokens (generation) agree.

Targets of the project: training tokens/s >= Hugging Face's, cached generation >= Hugging Face's.

    python benchmarks/lm_vs_hf.py                 # the defaults below, about 5 minutes on 2 cores
    python benchmarks/lm_vs_hf.py --keep-cpu-memory   # with the allocator setting of training
    python benchmarks/lm_vs_hf.py --d-model 512 --layers 8 --heads 8 --bf16
    python benchmarks/lm_vs_hf.py --baseline /tmp/other --rounds 5 --gen-rounds 5

Needs `transformers` (a test dependency of handformer). Nothing is downloaded.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from baseline import BaselineWorker, comparison_table, resolved_threads  # noqa: E402

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.convert.hf_weights import load_hf_into  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.inference.roofline import bound, read_bandwidth, roofline_line  # noqa: E402
from handformer.inference.threads import default_threads, intra_op_threads  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.training.cpu_memory import keep_freed_memory  # noqa: E402


def matmul_peak(dtype: torch.dtype, max_n: int = 2048, reps: int = 5) -> tuple[float, int]:
    """Best FLOP/s of an n x n matmul in `dtype`, and n. Starts at n = 512 and grows to max_n
    unless one product already takes long (bf16 without hardware support is very slow)."""
    n = 512
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    start = time.perf_counter()
    a @ b
    if time.perf_counter() - start < 0.05:
        n = max_n
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best, n


def build_models(args: argparse.Namespace) -> tuple[torch.nn.Module, CausalLM]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(args.seed)
    hf_cfg = GPT2Config(vocab_size=args.vocab, n_positions=args.max_positions, n_embd=args.d_model,
                        n_layer=args.layers, n_head=args.heads, n_inner=4 * args.d_model,
                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=True,
                        bos_token_id=None, eos_token_id=None)
    hf = GPT2LMHeadModel(hf_cfg)
    ours = CausalLM(CausalLMConfig.gpt2_style(
        vocab_size=args.vocab, max_positions=args.max_positions, d_model=args.d_model,
        n_layers=args.layers, n_heads=args.heads, d_ff=4 * args.d_model, dropout=0.0))
    load_hf_into(ours, hf.state_dict(), "gpt2")
    return hf, ours


def flops_per_token(model: CausalLM, T: int) -> float:
    """Training FLOPs per token (PaLM appendix B): 6 x the matmul parameters (all but the
    embedding tables; a tied head counts once as the head) + 12 L T D for attention scores."""
    cfg = model.cfg
    n = sum(p.numel() for name, p in model.named_parameters()
            if p.dim() == 2 and not name.startswith(("embed", "positions")))
    if cfg.tie_embeddings:
        n += model.lm_head.weight.numel()
    return 6 * n + 12 * cfg.n_layers * T * cfg.d_model


BASELINE = "handformer [baseline]"  # the baseline checkout's CausalLM, in the results
LOSS_TOLERANCE = 1e-6  # two checkouts' losses "agree" within this (the golden losses' tolerance)


def train_throughput(args: argparse.Namespace, hf: torch.nn.Module, ours: CausalLM,
                     baseline: BaselineWorker | None = None, seconds: dict[str, list[float]] | None = None,
                     ) -> dict[str, tuple[float, float]]:
    """Median tokens/s and last loss of each model in the same loop, rounds interleaved; with a
    baseline worker, its CausalLM from `ours`' starting weights too (under BASELINE). `seconds`,
    if given, receives each model's timed seconds of every round."""
    gen = torch.Generator().manual_seed(args.seed)
    n_batches = args.warmup + args.steps
    data = [torch.randint(0, args.vocab, (args.batch, args.block + 1), generator=gen)
            for _ in range(n_batches)]
    if baseline is not None:
        baseline.load("training", ours, "as loaded")  # before the first step: the same start
        baseline.batches("training", data)
    logits_of: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "huggingface": lambda x: hf(input_ids=x).logits,
        "handformer": lambda x: ours(x).logits,
    }
    models = {"huggingface": hf, "handformer": ours}
    optims = {k: torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
              for k, m in models.items()}
    speeds: dict[str, list[float]] = {k: [] for k in (*models, *([BASELINE] if baseline else []))}
    last_loss: dict[str, float] = {}
    tokens = args.batch * args.block
    seconds = {} if seconds is None else seconds

    def baseline_round() -> None:  # the same loop in the baseline checkout (benchmarks/baseline.py)
        elapsed, last_loss[BASELINE], _ = baseline.train("training", "training", args.warmup, args.bf16)
        speeds[BASELINE].append(args.steps * tokens / elapsed)
        seconds.setdefault(BASELINE, []).append(elapsed)

    for r in range(args.rounds):  # every other round in reverse order: the baseline next to ours
        if baseline is not None and r % 2:
            baseline_round()
        for name, model in (reversed if r % 2 else list)(models.items()):
            model.train()
            elapsed = 0.0
            for i, batch in enumerate(data):
                x, y = batch[:, :-1], batch[:, 1:]  # (B, T) inputs and next-token targets
                start = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
                    logits = logits_of[name](x)  # (B, T, V)
                loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), y.reshape(-1))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optims[name].step()
                optims[name].zero_grad(set_to_none=True)
                if i >= args.warmup:
                    elapsed += time.perf_counter() - start
                last_loss[name] = loss.item()
            speeds[name].append(args.steps * tokens / elapsed)
            seconds.setdefault(name, []).append(elapsed)
        if baseline is not None and not r % 2:
            baseline_round()
    return {k: (statistics.median(v), last_loss[k]) for k, v in speeds.items()}


def time_generation(fn: Callable[[], list[int]]) -> tuple[float, list[int]]:
    start = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - start, tokens


@torch.no_grad()
def generation_throughput(args: argparse.Namespace, hf: torch.nn.Module, ours: CausalLM,
                          new_tokens: int, baseline: BaselineWorker | None = None) -> None:
    """Tokens/s of each way to generate (best of --gen-rounds interleaved rounds), tokens compared;
    with a baseline worker (holding `ours`' weights as "generation"), its cached generation too, and
    the medians of this checkout's and the baseline's cached generation side by side."""
    gen = torch.Generator().manual_seed(args.seed + new_tokens)
    prompt = torch.randint(0, args.vocab, (1, args.prompt), generator=gen)  # (1, P)
    hf.eval()
    ours.eval()

    threads = resolved_threads(default_threads(ours))  # what "handformer (cache)" runs with
    print(f"generation: handformer and Hugging Face on {threads} thread(s)")

    def hf_generate() -> list[int]:
        with intra_op_threads(threads):  # the same thread count as handformer's generate
            out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=True,
                              pad_token_id=0, eos_token_id=None)
        return out[0, args.prompt:].tolist()

    def ours_generate(use_cache: bool) -> Callable[[], list[int]]:
        return lambda: generate(ours, prompt.tolist(), new_tokens, temperature=0.0,
                                use_cache=use_cache)[0]

    runs: dict[str, Callable[[], tuple[float, list[int]]]] = {
        "handformer (cache)": lambda: time_generation(ours_generate(True))}
    twin = BASELINE + " (cache)"
    if baseline is not None:  # right after its twin
        def baseline_generate() -> tuple[float, list[int]]:
            reply = baseline.generate("generation", prompt.tolist(), new_tokens, threads, use_cache=True)
            return reply.seconds, reply.result[0]  # the seconds the worker measured around generate

        runs[twin] = baseline_generate
    runs["huggingface generate"] = lambda: time_generation(hf_generate)
    best: dict[str, float] = {}
    every: dict[str, list[float]] = {}
    outputs: dict[str, list[int]] = {}
    same_every_round = True
    for fn in runs.values():  # warm-up of every path
        fn()
    for r in range(args.gen_rounds):
        for name, fn in (reversed if r % 2 else list)(runs.items()):  # every other round backwards
            seconds, outputs[name] = fn()
            best[name] = min(best.get(name, float("inf")), seconds)
            every.setdefault(name, []).append(seconds)
        if baseline is not None:
            same_every_round &= outputs[twin] == outputs["handformer (cache)"]
    seconds, outputs["handformer (no cache)"] = time_generation(ours_generate(False))
    best["handformer (no cache)"] = seconds  # one run: it is slow, and there is no warm-up effect

    limit = bound(read_bandwidth(threads), ours, args.prompt + new_tokens / 2)  # inference/roofline.py
    print(f"\ngeneration, greedy, batch 1, prompt {args.prompt} tokens, {new_tokens} new tokens:")
    ref = outputs["handformer (cache)"]
    for name, seconds in best.items():
        same = sum(a == b for a, b in zip(outputs[name], ref, strict=True))
        print(f"  {name:29s} {roofline_line(new_tokens / seconds, limit)}  ({seconds:6.2f} s)  "
              f"tokens equal to handformer (cache): {same}/{new_tokens}")
    hf_ratio = best["huggingface generate"] / best["handformer (cache)"]
    cache_ratio = best["handformer (no cache)"] / best["handformer (cache)"]
    print(f"  handformer cached vs huggingface generate: {hf_ratio:.2f}x the speed (target >= 1.0)")
    print(f"  handformer cached vs handformer without a cache: {cache_ratio:.2f}x the speed")
    if baseline is not None:
        row = ("handformer (cache)", every["handformer (cache)"], every[twin], same_every_round)
        print(comparison_table(f"generation, {new_tokens} new tokens", [row], baseline.label))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--max-positions", type=int, default=1280)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--steps", type=int, default=10, help="timed training steps per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of a round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt", type=int, default=16, help="prompt length for generation")
    p.add_argument("--gen-tokens", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--gen-rounds", type=int, default=2)
    p.add_argument("--bf16", action="store_true", help="train under bf16 autocast")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-generation", action="store_true")
    p.add_argument("--baseline", type=Path, help="another handformer checkout to time beside this one")
    p.add_argument("--keep-cpu-memory", action="store_true",
                   help="tune glibc malloc as `handformer train` does (cpu_memory.py), for both")
    args = p.parse_args()
    if max(args.gen_tokens) + args.prompt > args.max_positions:
        p.error("--max-positions must hold the prompt plus the longest --gen-tokens")

    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, glibc malloc keeps freed memory: "
          f"{args.keep_cpu_memory and keep_freed_memory()}")
    peaks = {}
    for dtype in (torch.float32, torch.bfloat16):
        peaks[dtype], n = matmul_peak(dtype)
        print(f"matmul peak {str(dtype)[6:]:8s} {peaks[dtype] / 1e9:8.1f} GFLOP/s ({n}x{n}, best of 5)")

    hf, ours = build_models(args)
    baseline = BaselineWorker(args.baseline) if args.baseline else None
    x = torch.randint(0, args.vocab, (2, 32))
    with torch.no_grad():
        diff = (hf.eval()(input_ids=x).logits - ours.eval()(x).logits).abs().max().item()
    print(f"\nmodel: GPT-2 style, d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
          f"vocab {args.vocab}, {ours.num_parameters() / 1e6:.2f}M parameters; same weights in both "
          f"(max logit difference {diff:.1e})")

    seconds: dict[str, list[float]] = {}
    results = train_throughput(args, hf, ours, baseline, seconds)
    peak = peaks[torch.bfloat16 if args.bf16 else torch.float32]
    fpt = flops_per_token(ours, args.block)
    print(f"\ntraining, batch {args.batch} x {args.block} tokens, {args.steps} timed steps x "
          f"{args.rounds} interleaved rounds, {'bf16 autocast' if args.bf16 else 'fp32'}:")
    for name, (speed, loss) in results.items():
        print(f"  {name:21s} {speed:9.0f} tokens/s  MFU {speed * fpt / peak:6.1%}  "
              f"final loss {loss:.4f}")
    ratio = results["handformer"][0] / results["huggingface"][0]
    print(f"  handformer vs huggingface: {ratio:.2f}x the tokens/s (target >= 1.0)")
    if baseline is not None:
        losses = results["handformer"][1], results[BASELINE][1]
        agree = abs(losses[0] - losses[1]) <= LOSS_TOLERANCE
        print(comparison_table("training", [("handformer", seconds["handformer"], seconds[BASELINE],
                                             f"final losses {'agree' if agree else 'DIFFER'}: "
                                             f"{losses[0]:.7f} vs {losses[1]:.7f}")], baseline.label))

    if not args.skip_generation:
        if baseline is not None:
            baseline.load("generation", ours, "as loaded")  # this checkout's trained weights
        for n in args.gen_tokens:
            generation_throughput(args, hf, ours, n, baseline)
    if baseline is not None:
        baseline.close()


if __name__ == "__main__":
    main()
