"""Benchmark: the instructions a decoding step of a tiny model costs, counted, beside another checkout.

On a shared virtual machine the wall clock and even the CPU seconds of a decoding step move by tens
of percent from one round to the next (a fixed pure-Python loop's CPU time alone varies 1.5x there),
which hides a difference of a few percent. Counting is exact: valgrind's cachegrind runs one greedy
`generate` of 20 tokens (the warm-up), then N more, in a process of its own, and the count of the
run with N tokens less that of the run without them is what the N tokens cost: instructions
executed, and (with `--cache-sim`) first-level instruction and data cache misses as cachegrind
simulates them. One intra-op thread, OMP/MKL pools of one, hash seed and address space fixed, so
two runs of the same code count the same.

Models and cases as benchmarks/decode_tiny.py's tiny Llama (5 layers, 64 wide, 8 / 4 heads, vocab
512, random weights, a 64-token prompt): "default" after `prepare_for_decoding`, "unfused" with
`pack_linears` only. With --baseline DIR, each case is counted with DIR's own code too (imports only
from DIR; the layout without inference/ is handled as benchmarks/baseline.py does).

    python benchmarks/decode_instructions.py --baseline /tmp/other --tokens 200 --cache-sim

Needs valgrind (`apt-get install valgrind`); a run takes about a minute a case and checkout.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The process valgrind counts: it imports handformer from the checkout only, as baseline.py's worker.
DRIVER = '''
import os, sys
sys.path.insert(0, os.environ["BENCHMARKS"])
from baseline import _check_provenance, _import, _only_this_checkout  # the worker's import rules

_only_this_checkout()
import torch

from handformer.config import CausalLMConfig
from handformer.generation.generate import generate
from handformer.models.causal_lm import CausalLM

_check_provenance()  # every handformer module from the checkout (the cwd)
torch.manual_seed(0)
TINY = dict(vocab_size=512, d_model=64, n_heads=8, n_kv_heads=4, d_ff=172, n_layers=5, max_positions=2048)
model = CausalLM(CausalLMConfig.llama_style(**TINY)).eval()
prompt = torch.randint(0, 512, (64,)).tolist()
if os.environ["CASE"] == "unfused":
    _import("handformer.inference.packed_linear", "handformer.nn.packed_linear", "pack_linears")(model)
else:
    _import("handformer.inference.prepare", "handformer.generation.prepare", "prepare_for_decoding")(model)
torch.set_num_threads(1)
generate(model, [prompt], 20, temperature=0, threads=1)  # the warm-up, in both counts
n = int(os.environ["TOKENS"])
if n:
    generate(model, [prompt], n, temperature=0, threads=1)
'''

COUNTS = {"I   refs": "instructions", "I1  misses": "I1 misses", "D1  misses": "D1 misses"}


def count(checkout: Path, case: str, tokens: int, cache_sim: bool, driver: Path) -> dict[str, int]:
    """cachegrind's totals for one driver run of `checkout`'s code."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "CASE": case, "TOKENS": str(tokens),
           "BENCHMARKS": str(ROOT / "benchmarks")}
    command = ["valgrind", "--tool=cachegrind", f"--cache-sim={'yes' if cache_sim else 'no'}",
               "--cachegrind-out-file=/dev/null", sys.executable, "-P", str(driver)]
    if shutil.which("setarch"):  # the same addresses every run
        command = ["setarch", os.uname().machine, "-R", *command]
    out = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the count of {checkout} ({case}) failed:\n{out.stderr[-2000:]}")
    totals = {}
    for key, name in COUNTS.items():
        found = re.search(rf"{re.escape(key)}:\s+([\d,]+)", out.stderr)
        if found:
            totals[name] = int(found.group(1).replace(",", ""))
    return totals


def per_token(checkout: Path, case: str, tokens: int, cache_sim: bool, driver: Path) -> dict[str, float]:
    warm = count(checkout, case, 0, cache_sim, driver)
    full = count(checkout, case, tokens, cache_sim, driver)
    return {name: (full[name] - warm[name]) / tokens for name in full}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="another handformer checkout to count beside this one")
    parser.add_argument("--tokens", type=int, default=200, help="the tokens counted (after 20 of warm-up)")
    parser.add_argument("--cases", nargs="+", default=["default", "unfused"], choices=["default", "unfused"])
    parser.add_argument("--cache-sim", action="store_true", help="count simulated I1 and D1 misses too")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    checkouts = {"this": ROOT}
    if args.baseline:
        if not (args.baseline / "handformer" / "__init__.py").is_file():
            raise SystemExit(f"--baseline {args.baseline}: no handformer/__init__.py there; give the root "
                             "of a handformer checkout (e.g. `git worktree add DIR <commit>`)")
        checkouts["baseline"] = args.baseline.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        driver = Path(tmp) / "driver.py"
        driver.write_text(DRIVER)
        print(f"tiny Llama, batch 1, greedy, per token over {args.tokens} tokens (after 20 of warm-up), "
              "counted by cachegrind")
        for case in args.cases:
            counted = {label: per_token(path, case, args.tokens, args.cache_sim, driver)
                       for label, path in checkouts.items()}
            for name in counted["this"]:
                line = f"  {case:8} {name:13} this {counted['this'][name]:12,.0f}"
                if "baseline" in counted:
                    base = counted["baseline"][name]
                    line += f"   baseline {base:12,.0f}   this/baseline {counted['this'][name] / base:.3f}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
