"""Benchmark: decoding speed against the memory-bandwidth limit, handformer vs Hugging Face.

In one run, on the machine at hand:

1. the memory read bandwidth: a streaming reduction over a 1 GiB tensor, timed in the same
   interleaved rounds as the decoding, the best round kept; the bound, bytes per token and MBU
   (tokens/s over the bound) are handformer/inference/roofline.py's, as every decode benchmark's;
2. a GPT-2-124M-shaped model (12 layers, 768 wide, 12 heads, vocab 50,257, tied head) and a
   Llama-style model of similar size (12 layers, 768 wide, 12 query / 4 key-value heads, SwiGLU
   2,048, vocab 32,000), random weights, greedy, batch 1, a 64-token prompt, 256 new tokens:
   tokens/s of handformer (fp32, int8 with the head, int8 with an fp32 head, int4 in groups of 32)
   and of Hugging Face `generate` on the same weights, and the bound = bandwidth / bytes read per
   token (weights as stored, the embedding lookup one row, plus the KV cache at the mean length),
   as a fraction;
3. time to first token for a 1,024-token prompt, handformer vs Hugging Face;
4. batch 8 and 32 (left-padded prompts of 32 to 64 tokens), tokens/s against Hugging Face;
5. a tiny Llama shaped like stories260K (5 layers, 64 wide, 8 / 4 heads, vocab 512), batch 1,
   beside llama2.c's `run.c` on stories260K itself when --run-c gives its path; `generate` decodes
   it with one thread (`default_threads`), also shown with torch's thread count for comparison;
   Hugging Face runs on the thread count of handformer's fp32 case, whatever the model;
6. where the batch-1 fp32 time goes: the model's matrix-vector products alone (every linear layer
   and the head once, one row, the model's own weights), their GB/s (torch's practical ceiling for
   a decoding step) and their share of a decoding step;
7. with --compile: `generate(compile_step=True)` (the static compiled step), on the prepared
   model and on plain nn.Linear layers: the first call's compile seconds, tokens/s, bound and MBU
   beside eager in the same interleaved rounds, and after how many tokens compiling pays;
   --compile-only prints just that (and the bandwidth) for each model;
8. with --baseline DIR: every handformer case of 2 to 5 (each fp32, int8, int4 and bf16 case of
   batch 1, the time to first token, batch 8 and 32) also run by another handformer checkout
   (`git worktree add DIR <commit>`) in a worker process that imports only from DIR
   (benchmarks/baseline.py): the same weights, prompts and thread count, prepared the same way with
   DIR's own code, timed in the same interleaved rounds; a table per model gives each pair's
   medians, their ratio and whether the tokens agree.

Every case's tokens are compared with Hugging Face's fp32 tokens on the same prompts: batch 1
(fp32, int8, int4, bf16), the first token after the long prompt, batch 8 and 32. The fp32 cases
must agree: where one differs, the script says so and exits with status 1. The quantized cases are
reported as measured (how many tokens agree before each row's first difference).

Every figure is the median of --rounds interleaved rounds (default 5). The targets are printed
beside the ratios. Other jobs on a shared machine make every figure noisy.

    python benchmarks/decode_limit.py                       # everything, ~15 min on 2 cores
    python benchmarks/decode_limit.py --models tiny --rounds 1 --new-tokens 8   # a smoke run
    python benchmarks/decode_limit.py --run-c /path/to/llama2.c/run --compile
    python benchmarks/decode_limit.py --baseline /tmp/other    # beside another checkout
    python benchmarks/decode_limit.py --baseline /tmp/other --models gpt2-124M --few-cases --batches 8

Needs `transformers` (a test dependency of handformer). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from baseline import BaselineWorker, Reply, comparison_table, resolved_threads  # noqa: E402

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.convert.hf_export import export_state_dict, hf_config  # noqa: E402
from handformer.data.lookup import folder  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.inference.packed_linear import PackedLinear  # noqa: E402
from handformer.inference.prepare import prepare_for_decoding  # noqa: E402
from handformer.inference.quant import quantize_linears  # noqa: E402
from handformer.inference.roofline import bytes_per_token  # noqa: E402
from handformer.inference.static_step import static_step_for  # noqa: E402
from handformer.inference.threads import default_threads, intra_op_threads  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402

SHAPES = {
    "gpt2-124M": lambda: CausalLMConfig.gpt2_style(vocab_size=50257, d_model=768, n_heads=12, d_ff=3072,
                                                   n_layers=12, max_positions=2048, dropout=0.0),
    "llama-gqa": lambda: CausalLMConfig.llama_style(vocab_size=32000, d_model=768, n_heads=12,
                                                    n_kv_heads=4, d_ff=2048, n_layers=12, max_positions=2048),
    "tiny": lambda: CausalLMConfig.llama_style(vocab_size=512, d_model=64, n_heads=8, n_kv_heads=4,
                                               d_ff=172, n_layers=5, max_positions=2048),
}


def bandwidth(data: torch.Tensor) -> float:
    """Bytes/s of one streaming read of `data` (a sum: every byte read once, nothing written)."""
    start = time.perf_counter()
    data.sum()
    return data.numel() * data.element_size() / (time.perf_counter() - start)


def hf_twin(model: CausalLM):
    """The Hugging Face model with `model`'s weights (GPT2LMHeadModel or LlamaForCausalLM)."""
    import transformers

    model_type = "gpt2" if model.cfg.position == "learned" else "llama"
    config = hf_config(model.cfg, model_type, {"bos_token_id": None, "eos_token_id": None,
                                               "pad_token_id": 0})
    config_cls = transformers.GPT2Config if model_type == "gpt2" else transformers.LlamaConfig
    cls = transformers.GPT2LMHeadModel if model_type == "gpt2" else transformers.LlamaForCausalLM
    hf = cls(config_cls(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")}))
    result = hf.load_state_dict(export_state_dict(model.state_dict(), model.cfg, model_type), strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"lm_head.weight"}:  # only a tied head
        raise ValueError(f"weights do not match {cls.__name__}: {result}")
    if model.cfg.tie_embeddings:
        hf.tie_weights()
    return hf.eval()


def hf_generate(hf, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Hugging Face `generate`, greedy, left-padded, exactly `new_tokens` tokens a row."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                      min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None)
    return out[:, width:].tolist()


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rounds(cases: dict[str, Callable[[], object]], n: int, data: torch.Tensor | None = None,
           runs: dict[str, list[tuple[float, object]]] | None = None) -> dict[str, float]:
    """Median seconds of each case over `n` interleaved rounds, every other one in reverse order
    (the best bandwidth in bytes/s under "bw"). A case that returns a baseline `Reply` counts the seconds the
    worker measured around its call. `runs`, if given, receives each case's (seconds, result) of
    every round."""
    for fn in cases.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in cases}
    bws = []
    for r in range(n):
        if data is not None:
            bws.append(bandwidth(data))
        for name, fn in (reversed if r % 2 else list)(cases.items()):
            start = time.perf_counter()
            out = fn()
            seconds = time.perf_counter() - start
            if isinstance(out, Reply):
                seconds, out = out.seconds, out.result
            times[name].append(seconds)
            if runs is not None:
                runs.setdefault(name, []).append((seconds, out))
    medians = {k: statistics.median(v) for k, v in times.items()}
    if bws:
        medians["bw"] = max(bws)  # the read bandwidth: the best streaming read (inference/roofline.py)
    return medians


def matvec_share(model: CausalLM, seconds_per_token: float, n: int) -> str:
    """One line: the model's linear layers (and head) applied to one row, as in a decoding step:
    milliseconds, GB/s of weights read, and their share of `seconds_per_token`."""
    linears = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, PackedLinear))]
    rows = [torch.randn(1, 1, m.in_features) for m in linears]
    weight_bytes = sum(m.in_features * m.out_features * 4 for m in linears)  # fp32

    def all_linears() -> None:
        for m, x in zip(linears, rows):
            m(x)

    with torch.inference_mode():
        med = rounds({"matvec": all_linears}, n)["matvec"]
    return (f"  matrix-vector products alone (every linear + head, one row): {med * 1e3:.2f} ms a token "
            f"= {weight_bytes / med / 1e9:.1f} GB/s of weights, {med / seconds_per_token:.0%} of a "
            f"decoding step ({seconds_per_token * 1e3:.2f} ms)")


DEFAULT_STEP = "default (fused C step), prepared"  # compile_table's yardstick: generate as is


def compile_table(model: CausalLM, plain: CausalLM, prompt: list[int], n: int, n_rounds: int,
                  data: torch.Tensor, stored_bytes: float) -> None:
    """Print the default step (the fused C step where it applies, else eager) against
    `generate(compile_step=True)` (inference/static_step.py) at batch 1:
    the first compiled call's compile seconds, then tokens/s, bound and MBU of each, in the same
    interleaved rounds, and after how many tokens compiling pays for itself."""
    cases = {DEFAULT_STEP: lambda: generate(model, [prompt], n, temperature=0),
             "compiled, prepared": lambda: generate(model, [prompt], n, temperature=0, compile_step=True),
             "compiled, plain nn.Linear": lambda: generate(plain, [prompt], n, temperature=0,
                                                           compile_step=True)}
    eager_tokens = cases[DEFAULT_STEP]()
    for case in ("compiled, prepared", "compiled, plain nn.Linear"):
        m = model if "prepared" in case else plain
        start = time.perf_counter()
        same = cases[case]() == eager_tokens
        first = time.perf_counter() - start
        compiled = static_step_for(m).compile_seconds
        print(f"  {case}: first call {first:.1f} s (compiling {sum(compiled.values()):.1f} s), "
              f"tokens the same as the default step's: {same}")
    with torch.inference_mode():
        med = rounds(cases, n_rounds, data)
    bound = med["bw"] / stored_bytes
    print(f"  {'compiled decoding step':33} {'tokens/s':>9} {'bound':>8} {'MBU':>9} {'vs default':>10}")
    for case in cases:
        tps = n / med[case]
        print(f"  {case:33} {tps:>9.1f} {bound:>8.1f} {tps / bound:>8.2f}  "
              f"{med[DEFAULT_STEP] / med[case]:>9.2f}x")
    saved = (med[DEFAULT_STEP] - med["compiled, prepared"]) / n
    compile_s = sum(static_step_for(model).compile_seconds.values())
    print(f"  compiling ({compile_s:.1f} s) pays after "
          + (f"{compile_s / saved:,.0f} tokens" if saved > 0 else "never (no faster)"))


def llama2c(run_c: str, new_tokens: int, n: int, stories: Path | None = None) -> float | None:
    """run.c's own tokens/s on stories260K, median of `n` runs (greedy)."""
    stories = stories or folder("stories260K")
    model, tok = stories / "stories260K.bin", stories / "tok512.bin"
    if not model.is_file() or not tok.is_file():
        raise FileNotFoundError(f"no stories260K.bin and tok512.bin in {stories}; give --stories DIR")
    figures = []
    for _ in range(n):
        out = subprocess.run([run_c, str(model), "-z", str(tok), "-t", "0", "-n", str(new_tokens),
                              "-i", "Once upon a time"], capture_output=True, text=True, timeout=120)
        match = re.search(r"achieved tok/s: ([0-9.]+)", out.stderr + out.stdout)
        if match:
            figures.append(float(match.group(1)))
    return statistics.median(figures) if figures else None


FP32 = ("handformer fp32", "handformer fp32, plain nn.Linear", "handformer fp32, torch's threads")


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> tuple[bool, str]:
    """Whether `ours` equals `theirs` row for row, and in words: "same", or how many rows differ
    and how many tokens agree before each row's first difference."""
    if ours == theirs:
        return True, "same"
    agree = sum(next((i for i, (a, b) in enumerate(zip(o, t)) if a != b), min(len(o), len(t)))
                for o, t in zip(ours, theirs))
    rows = sum(o != t for o, t in zip(ours, theirs))
    return False, (f"differs in {rows} of {len(theirs)} row(s); {agree} of {sum(map(len, theirs))} "
                   "tokens agree before each row's first difference")


def compare_tokens(label: str, ours: dict[str, list[list[int]]], theirs: list[list[int]],
                   mismatches: list[str]) -> None:
    """Print each case's agreement with HF's tokens; an fp32 case that differs joins `mismatches`."""
    for case, tokens in ours.items():
        same, words = agreement(tokens, theirs)
        print(f"  tokens against HF fp32, {label}, {case}: {words}")
        if not same and (case in FP32 or case == "handformer"):
            mismatches.append(f"{label}, {case}: {words}")


def variant(model: CausalLM, skip: tuple[str, ...] = (), bits: int | None = None) -> CausalLM:
    """A copy of `model`, quantized to `bits` (except the layers in `skip`) if bits is given."""
    copy = CausalLM(model.cfg).eval()
    copy.load_state_dict(model.state_dict())
    if bits is not None:
        quantize_linears(copy, skip=skip, bits=bits, group_size=32)
    return copy


TWIN = " [baseline]"  # the name of a case's twin in the baseline checkout: the case's name + TWIN


def with_twins(cases: dict[str, Callable[[], object]], twins: dict[str, Callable[[], Reply]],
               ) -> dict[str, Callable[[], object]]:
    """`cases` with each case's baseline twin (from `twins`, by case name) right after it."""
    out: dict[str, Callable[[], object]] = {}
    for case, fn in cases.items():
        out[case] = fn
        if case in twins:
            out[case + TWIN] = twins[case]
    return out


def twin_rows(runs: dict[str, list[tuple[float, object]]], prefix: str = "",
              ) -> list[tuple[str, list[float], list[float], bool]]:
    """comparison_table rows of every case in `runs` that has a twin: seconds of each round, and
    whether the twin's tokens equal the case's in every round."""
    rows = []
    for case, ours in runs.items():
        theirs = runs.get(case + TWIN)
        if theirs is not None:
            same = all(a[1] == b[1] for a, b in zip(ours, theirs, strict=True))
            rows.append((prefix + case, [t for t, _ in ours], [t for t, _ in theirs], same))
    return rows


def batch1(name: str, args: argparse.Namespace, data: torch.Tensor,
           baseline: BaselineWorker | None = None) -> list[str]:
    """Time and compare every case of one model; returns the fp32 cases whose tokens differ
    from Hugging Face's."""
    mismatches: list[str] = []
    torch.manual_seed(0)
    plain = CausalLM(SHAPES[name]()).eval()  # plain nn.Linear layers: F.linear (MKL on x86)
    hf = hf_twin(plain)
    int8 = variant(plain, bits=8)
    if getattr(args, "few_cases", False):  # the cases left out are not built: the int8 model stands in
        int8_body = int4 = bf16 = int8
    else:
        int8_body, int4 = variant(plain, ("lm_head",), 8), variant(plain, bits=4)
        bf16 = variant(plain).to(torch.bfloat16)  # `handformer quantize --bf16`
    stored_bytes = {id(m): bytes_per_token(m, args.prompt + args.new_tokens / 2)
                    for m in (plain, int8, int8_body, int4, bf16)}  # before packing: the same bytes
    model = prepare_for_decoding(variant(plain))  # what `handformer generate` runs
    stored_bytes[id(model)] = stored_bytes[id(plain)]
    for m in {id(m): m for m in (int8, int8_body, int4, bf16)}.values():
        prepare_for_decoding(m)
    prompt = torch.randint(0, model.cfg.vocab_size, (args.prompt,)).tolist()
    n = args.new_tokens
    # the baseline checkout's twin of each case: plain's weights prepared the same way, run with
    # the thread count this checkout's case runs with (threads="auto": default_threads)
    auto = {case: resolved_threads(default_threads(m)) for case, m in (
        ("handformer fp32", model), ("handformer fp32, plain nn.Linear", plain), ("handformer int8", int8),
        ("handformer int8, head fp32", int8_body), ("handformer int4 (groups of 32)", int4),
        ("handformer bf16 weights", bf16))}
    auto["handformer fp32, torch's threads"] = torch.get_num_threads()
    twin_models = {"handformer fp32": "prepare_for_decoding", "handformer fp32, plain nn.Linear": "as loaded",
                   "handformer fp32, torch's threads": "prepare_for_decoding", "handformer int8": "int8",
                   "handformer int8, head fp32": "int8, head fp32",
                   "handformer int4 (groups of 32)": "int4 groups of 32",
                   "handformer bf16 weights": "bf16 weights"}
    if getattr(args, "few_cases", False):  # fp32, HF and int8 only: a shorter run
        twin_models = {k: v for k, v in twin_models.items() if k in FEW_CASES}
    twins: dict[str, Callable[[], Reply]] = {}
    if baseline is not None:
        for how in sorted(set(twin_models.values())):
            baseline.load(how, plain, how)
        twins = {case: lambda how=how, t=auto[case]: baseline.generate(how, [prompt], n, t)
                 for case, how in twin_models.items()}

    def fp32_twin(prompts: list[list[int]], new_tokens: int) -> dict[str, Callable[[], Reply]]:
        """The baseline twin of this checkout's prepared fp32 model on `prompts`, if any."""
        threads = auto["handformer fp32"]
        return {"handformer": lambda: baseline.generate("prepare_for_decoding", prompts, new_tokens, threads)
                } if baseline is not None else {}

    comparison: list[tuple[str, list[float], list[float], bool]] = []
    hf_threads = auto["handformer fp32"]  # HF on handformer's thread count, not torch's default

    def hf_call(prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        with intra_op_threads(hf_threads):
            return hf_generate(hf, prompts, new_tokens)

    with torch.no_grad():
        ours, theirs = generate(model, [prompt], n, temperature=0), hf_call([prompt], n)
        cases = {"handformer fp32": lambda: generate(model, [prompt], n, temperature=0),
                 **({"handformer fp32, plain nn.Linear": lambda: generate(plain, [prompt], n, temperature=0)}
                    if any(isinstance(m, PackedLinear) for m in model.modules()) else {}),
                 **({"handformer fp32, torch's threads": lambda: generate(model, [prompt], n, temperature=0,
                                                                          threads=None)}
                    if default_threads(model) is not None else {}),
                 "HF generate fp32": lambda: hf_call([prompt], n),
                 "handformer int8": lambda: generate(int8, [prompt], n, temperature=0),
                 "handformer int8, head fp32": lambda: generate(int8_body, [prompt], n, temperature=0),
                 "handformer int4 (groups of 32)": lambda: generate(int4, [prompt], n, temperature=0),
                 "handformer bf16 weights": lambda: generate(bf16, [prompt], n, temperature=0)}
        if getattr(args, "few_cases", False):
            cases = {k: v for k, v in cases.items() if k in FEW_CASES}
        runs: dict[str, list[tuple[float, object]]] = {}
        med = rounds(with_twins(cases, twins), args.rounds, data, runs)
        comparison += twin_rows(runs, "batch 1: ")
    base = n / med["handformer fp32"]
    print(f"\n{name}: batch 1, prompt {args.prompt}, {n} new tokens, bandwidth "
          f"{med['bw'] / 1e9:.1f} GB/s (same tokens as HF: {ours[0] == theirs[0]}); threads: "
          f"handformer fp32 and HF {hf_threads}, " + ", ".join(
              f"{case} {auto[case]}" for case in cases if case in auto and case != "handformer fp32"))
    compare_tokens("batch 1", {case: runs[case][0][1] for case in cases if case != "HF generate fp32"},
                   runs["HF generate fp32"][0][1], mismatches)
    print(f"  {'':33} {'tokens/s':>9} {'bound':>8} {'MBU':>9} {'vs fp32':>8}")
    shown = [("handformer fp32", model)] + [(c, model) for c in med if c.endswith(("threads", "nn.Linear"))]
    for case, m in (*shown, ("HF generate fp32", model), ("handformer int8", int8),
                    ("handformer int8, head fp32", int8_body), ("handformer int4 (groups of 32)", int4),
                    ("handformer bf16 weights", bf16)):
        if case not in med:
            continue
        tps, bound = n / med[case], med["bw"] / stored_bytes[id(m)]
        print(f"  {case:33} {tps:>9.1f} {bound:>8.1f} {tps / bound:>8.2f}  {tps / base:>7.2f}x")
    print(f"  handformer / HF fp32: {base / (n / med['HF generate fp32']):.2f}x (target >= 1.15x; "
          "fp32 target >= 0.85 of the bound; int8 with head target >= 2.2x fp32; int4 >= 3x fp32)")
    with intra_op_threads(default_threads(model)):
        print(matvec_share(model, med["handformer fp32"] / n, args.rounds))
        if model is not plain and "handformer fp32, plain nn.Linear" in med:
            print(matvec_share(plain, med["handformer fp32, plain nn.Linear"] / n, args.rounds)
                  .replace("products alone", "products alone, plain nn.Linear"))
    if getattr(args, "compile", False):  # a Namespace built by hand (tests/test_quant.py) may lack it
        compile_table(model, plain, prompt, n, args.rounds, data, stored_bytes[id(model)])
    if name != "tiny":
        long_prompt = torch.randint(0, model.cfg.vocab_size, (args.ttft_prompt,)).tolist()
        with torch.no_grad():
            runs = {}
            ttft = rounds(with_twins(
                {"handformer": lambda: generate(model, [long_prompt], 1, temperature=0),
                 "HF": lambda: hf_call([long_prompt], 1)},
                fp32_twin([long_prompt], 1)), args.rounds, runs=runs)
            comparison += twin_rows(runs, f"time to first token, {args.ttft_prompt}: ")
        compare_tokens(f"first token after {args.ttft_prompt}", {"handformer": runs["handformer"][0][1]},
                       runs["HF"][0][1], mismatches)
        print(f"  time to first token, {args.ttft_prompt}-token prompt: handformer "
              f"{ttft['handformer']:.3f} s, HF {ttft['HF']:.3f} s ({ttft['HF'] / ttft['handformer']:.2f}x)")
        nb = args.batch_new_tokens
        for batch in args.batches:
            gen = torch.Generator().manual_seed(batch)
            lengths = torch.randint(32, 65, (batch,), generator=gen).tolist()
            prompts = [torch.randint(0, model.cfg.vocab_size, (length,), generator=gen).tolist()
                       for length in lengths]
            with torch.no_grad():
                runs = {}
                med_b = rounds(with_twins(
                    {"handformer": lambda p=prompts: generate(model, p, nb, temperature=0),
                     "HF": lambda p=prompts: hf_call(p, nb)},
                    fp32_twin(prompts, nb)), args.rounds, runs=runs)
                comparison += twin_rows(runs, f"batch {batch}, {nb} new tokens: ")
            compare_tokens(f"batch {batch}", {"handformer": runs["handformer"][0][1]}, runs["HF"][0][1],
                           mismatches)
            ours_tps, hf_tps = batch * nb / med_b["handformer"], batch * nb / med_b["HF"]
            print(f"  batch {batch}, {nb} new tokens: handformer {ours_tps:.1f} tokens/s, HF {hf_tps:.1f} "
                  f"({ours_tps / hf_tps:.2f}x, target >= 1.2x)")
    elif args.run_c:
        c = llama2c(args.run_c, n, args.rounds, args.stories)
        ratio = f" ({c / base:.1f}x handformer fp32)" if c else " (no 'achieved tok/s' line)"
        print(f"  llama2.c run.c on stories260K: {c} tokens/s{ratio}")
    if baseline is not None:
        print(comparison_table(name, comparison, baseline.label))
    return mismatches


FEW_CASES = ("handformer fp32", "HF generate fp32", "handformer int8")  # --few-cases: batch 1's cases


def compile_only(name: str, args: argparse.Namespace, data: torch.Tensor) -> None:
    """--compile-only: the compile table of one model (random weights, seed 0)."""
    torch.manual_seed(0)
    plain = CausalLM(SHAPES[name]()).eval()
    stored = bytes_per_token(plain, args.prompt + args.new_tokens / 2)
    model = prepare_for_decoding(variant(plain))
    prompt = torch.randint(0, model.cfg.vocab_size, (args.prompt,)).tolist()
    print(f"\n{name}: batch 1, prompt {args.prompt}, {args.new_tokens} new tokens, greedy")
    compile_table(model, plain, prompt, args.new_tokens, args.rounds, data, stored)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--ttft-prompt", type=int, default=1024)
    parser.add_argument("--batches", type=int, nargs="*", default=[8, 32])
    parser.add_argument("--batch-new-tokens", type=int, default=64)
    parser.add_argument("--bandwidth-mib", type=int, default=1024, help="size of the streamed tensor")
    parser.add_argument("--run-c", help="path of a compiled llama2.c `run` binary (for the tiny model)")
    parser.add_argument("--stories", type=Path, default=None,
                        help="folder with llama2.c's stories260K.bin and tok512.bin (default: the dataset)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compile", action="store_true", help="also time generate(compile_step=True)")
    parser.add_argument("--compile-only", action="store_true", help="time only eager against compiled")
    parser.add_argument("--baseline", type=Path, help="another handformer checkout to time beside this one")
    parser.add_argument("--few-cases", action="store_true",
                        help="batch 1: only fp32 (prepared), HF and int8 with the head (a shorter run)")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # each line as soon as it is measured
    if args.threads:
        torch.set_num_threads(args.threads)
    data = torch.ones(args.bandwidth_mib * 2**20 // 4)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}; medians of {args.rounds} interleaved rounds")
    baseline = BaselineWorker(args.baseline) if args.baseline else None  # after --threads: the same count
    mismatches = []
    for name in args.models:
        if args.compile_only:
            compile_only(name, args, data)
            continue
        mismatches += [f"{name}: {m}" for m in batch1(name, args, data, baseline)]
    if baseline is not None:
        baseline.close()
    if mismatches:
        print("fp32 tokens differ from Hugging Face's:\n  " + "\n  ".join(mismatches))
        sys.exit(1)


if __name__ == "__main__":
    main()
