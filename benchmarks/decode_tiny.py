"""Benchmark: decoding a tiny model, where per-operation overhead rules, beside other
implementations.

Two models, batch 1, greedy, 256 new tokens, `generate` as `handformer generate` runs it (one
intra-op thread for a model this small, `default_threads`):
- "tiny": the 5-layer, 64-wide Llama of benchmarks/decode_limit.py (8 / 4 heads, vocab 512, random
  weights), a 64-token prompt;
- "stories260K": llama2.c's trained stories260K (`import-llama2c` of the stories260K dataset, docs/data.md),
  from BOS, beside Hugging Face's LlamaForCausalLM on the same weights (`export-hf`) and, with
  --run-c, llama2.c's own run.c.

Cases, each timed once per round, rounds interleaved (every other one in reverse order), medians
reported (the CPU is shared):
- "default": this checkout, the model after `prepare_for_decoding` (fused projections, dropout
  removed, large weights packed: what `handformer generate` runs);
- "unfused": this checkout, the model as loaded, large weights packed (`pack_linears` only);
- "baseline default" and "baseline unfused": with --baseline DIR, another checkout of handformer
  (`git worktree add DIR <commit>`), the same weights, prompt and thread count, prepared the same two
  ways with DIR's own code, in a worker process that imports only from DIR (benchmarks/baseline.py);
- "worker default" and "worker unfused": with --baseline, this checkout's twins of those, run in a
  worker process of the same kind, so that the two checkouts are compared in like processes (the
  benchmark's own process also holds Hugging Face's model and the other cases' models).
The tokens of every case are compared with the default's, and each baseline case's with its twin's;
a table gives each twin pair (worker of this checkout, worker of DIR) its medians and their ratio,
in wall seconds and in the CPU seconds of each process (one intra-op thread: the work itself, which
a neighbour's load disturbs much less).

Each model's bandwidth bound and every case's MBU (handformer/inference/roofline.py, one thread):
the weights sit in the cache and each step is per-operation overhead, so MBU is a few percent and
means little; run.c is the yardstick here.

    python benchmarks/decode_tiny.py --baseline /tmp/main_src --run-c /tmp/l2c/run
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from baseline import BaselineWorker, comparison_table, resolved_threads  # noqa: E402

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.data.lookup import folder  # noqa: E402
from handformer.generation.generate import generate  # noqa: E402
from handformer.inference.packed_linear import pack_linears  # noqa: E402
from handformer.inference.prepare import prepare_for_decoding  # noqa: E402
from handformer.inference.roofline import bound, read_bandwidth  # noqa: E402
from handformer.inference.threads import default_threads  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.tasks.lm.exports import export_hf  # noqa: E402
from handformer.tasks.lm.imports import import_llama2c  # noqa: E402
from handformer.tasks.lm.run import load_lm  # noqa: E402

TINY = dict(vocab_size=512, d_model=64, n_heads=8, n_kv_heads=4, d_ff=172, n_layers=5, max_positions=2048)

def timed_generate(model: CausalLM, prompt: list[int], n: int) -> tuple[float, list[int], float]:
    """(wall seconds, new tokens, CPU seconds of this process) of one greedy generate."""
    cpu, start = time.process_time(), time.perf_counter()
    out = generate(model, [prompt], n, temperature=0)[0]
    return time.perf_counter() - start, out, time.process_time() - cpu


def hf_generate(hf: torch.nn.Module, prompt: list[int], n: int) -> tuple[float, list[int]]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        start = time.perf_counter()
        out = hf.generate(ids, do_sample=False, min_new_tokens=n, max_new_tokens=n, pad_token_id=0,
                          eos_token_id=None)
        seconds = time.perf_counter() - start
    return seconds, out[0, len(prompt):].tolist()


def run_c(binary: str, n: int, stories: Path) -> tuple[float, None]:
    """Seconds for n tokens at run.c's own reported rate (it times from its second token)."""
    out = subprocess.run([binary, str(stories / "stories260K.bin"), "-z", str(stories / "tok512.bin"),
                          "-t", "0", "-n", str(n + 1)], capture_output=True, text=True, check=True,
                         timeout=120)
    rate = float(re.search(r"achieved tok/s: ([0-9.]+)", out.stderr + out.stdout).group(1))
    return n / rate, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--baseline", type=Path, help="another handformer checkout to time beside this one")
    parser.add_argument("--run-c", help="path of a compiled llama2.c `run` binary")
    parser.add_argument("--stories", type=Path, default=None,
                        help="folder with stories260K.bin and tok512.bin (default: the dataset)")
    args = parser.parse_args()
    args.stories = args.stories or folder("stories260K")
    torch.set_num_threads(1)  # Hugging Face and run.c on one thread too, as `generate` for these models
    n = args.new_tokens
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        tiny = CausalLM(CausalLMConfig.llama_style(**TINY)).eval()
        import_llama2c(args.stories / "stories260K.bin", args.stories / "tok512.bin", Path(tmp) / "stories")
        stories = load_lm(Path(tmp) / "stories").model
        import transformers

        export_hf(Path(tmp) / "stories", Path(tmp) / "hf")
        hf = transformers.LlamaForCausalLM.from_pretrained(Path(tmp) / "hf").eval()
        prompts = {"tiny": torch.randint(0, 512, (64,)).tolist(), "stories260K": [1]}
        baseline = BaselineWorker(args.baseline, threads=1) if args.baseline else None
        this = BaselineWorker(ROOT, threads=1) if args.baseline else None  # its twins, in a like process
        models = {}
        for name, model in (("tiny", tiny), ("stories260K", stories)):
            fused = CausalLM(model.cfg).eval()
            fused.load_state_dict(model.state_dict())
            for worker in filter(None, (baseline, this)):  # the twins of the two cases below, same weights
                worker.load(f"{name} default", model, "prepare_for_decoding")
                worker.load(f"{name} unfused", model, "pack_linears")
            pack_linears(model.eval())
            models[name] = {"default": prepare_for_decoding(fused), "unfused": model}
        cases = {}
        for name in models:
            for kind in ("default", "unfused"):
                cases[name, kind] = lambda m=models[name][kind], p=prompts[name]: timed_generate(m, p, n)
                if baseline:  # the twins right after their case
                    # the thread count this checkout's case runs with ("auto": default_threads)
                    threads = resolved_threads(default_threads(models[name][kind]))
                    for label, worker in (("worker", this), ("baseline", baseline)):
                        def twin(name: str = name, kind: str = kind, threads: int = threads,
                                 worker: BaselineWorker = worker) -> tuple[float, list[int], float]:
                            reply = worker.generate(f"{name} {kind}", [prompts[name]], n, threads)
                            return reply.seconds, reply.result[0], reply.cpu_seconds

                        cases[name, f"{label} {kind}"] = twin
        cases["stories260K", "HF generate"] = lambda: hf_generate(hf, [1], n)
        if args.run_c:
            cases["stories260K", "llama2.c run.c"] = lambda: run_c(args.run_c, n, args.stories)
        times: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
        cpu_times: dict[tuple[str, str], list[float]] = {case: [] for case in cases}
        same: dict[tuple[str, str], bool] = {}
        twin_same: dict[tuple[str, str], bool] = {}
        for fn in cases.values():
            fn()  # warm-up
        for r in range(args.rounds):
            outputs = {}
            for case, fn in (reversed if r % 2 else list)(cases.items()):  # every other round backwards
                seconds, outputs[case], *cpu = fn()
                times[case].append(seconds)
                cpu_times[case] += cpu  # this checkout's cases and their twins
            for (name, kind), tokens in outputs.items():
                if kind != "default" and tokens is not None:
                    same[name, kind] = same.get((name, kind), True) and tokens == outputs[name, "default"]
                if kind.startswith("baseline "):
                    ours = outputs[name, kind.replace("baseline ", "worker ")]
                    twin_same[name, kind] = twin_same.get((name, kind), True) and tokens == ours
        for worker in filter(None, (baseline, this)):
            worker.close()
    bandwidth = read_bandwidth(1)
    print(f"torch {torch.__version__}, batch 1, greedy, {n} new tokens, 1 thread, medians of {args.rounds} "
          f"interleaved rounds (shared CPU: other jobs make rounds vary), read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s")
    for name in models:
        base = statistics.median(times[name, "default"])
        about = "prompt: BOS" if name == "stories260K" else "random weights, 64-token prompt"
        limit = bound(bandwidth, models[name]["default"], len(prompts[name]) + n / 2)
        print(f"\n{name} ({about}), bound {limit:.0f} tokens/s")
        for (model_name, case), values in times.items():
            if model_name != name:
                continue
            median = statistics.median(values)
            tokens = "" if (model_name, case) not in same else (
                "  same tokens" if same[model_name, case] else "  DIFFERENT tokens")
            print(f"  {case:16s} {n / median:9.1f} tokens/s  MBU {n / median / limit:5.2f}  "
                  f"default / this {median / base:5.2f}x  "
                  f"rounds: {', '.join(f'{n / v:.0f}' for v in values)}{tokens}")
        if baseline:  # this checkout's worker against the baseline's
            rows = [(kind, times[name, f"worker {kind}"], times[name, f"baseline {kind}"],
                     twin_same[name, f"baseline {kind}"]) for kind in ("default", "unfused")]
            print(comparison_table(name, rows, baseline.label))
            rows = [(kind, cpu_times[name, f"worker {kind}"], cpu_times[name, f"baseline {kind}"],
                     twin_same[name, f"baseline {kind}"]) for kind in ("default", "unfused")]
            print(comparison_table(f"{name}, CPU seconds (less disturbed)", rows, baseline.label))


if __name__ == "__main__":
    main()
