"""Why LoRA fine-tuning looked slow on this shared machine: torch's intra-op threads under load.

A tiny Llama (the `llama` base of finetune_shakespeare.py: 128 wide, 4 layers, grouped-query
attention, SwiGLU; random weights) trains on random windows of 64 tokens, batches of 12, AdamW:
fully and with LoRA on every linear layer of the blocks. Each is timed with 1 and with 2 torch
threads while 0, 1 or 2 busy-looping processes stand for the other jobs on a 2-core machine.
Rounds are interleaved; the median step time of each cell is printed.

With a second thread every parallel kernel (a matmul, an elementwise op on more than ~32K
elements) ends at a barrier where the caller waits for the other thread; when that thread has
been descheduled for another process, the wait is a scheduler time slice, per kernel. LoRA on all
linear layers runs about 2.5x the matmuls of full fine-tuning per step (each adapted layer: the
frozen product, A, B forward; x's gradient through W, then the gradients of A, B and their inputs
backward), so it pays this wait more often.

    python benchmarks/lora_threads_under_load.py
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.adapters.lora import LoRAConfig, add_lora  # noqa: E402
from handformer.config import CausalLMConfig  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402

BUSY = [sys.executable, "-c", "while True: pass"]


def build(rank: int) -> tuple[CausalLM, torch.optim.Optimizer]:
    torch.manual_seed(0)
    cfg = CausalLMConfig.llama_style(vocab_size=65, d_model=128, n_heads=4, n_kv_heads=2, d_ff=352,
                                     n_layers=4, max_positions=64)
    model = CausalLM(cfg)
    if rank:
        add_lora(model, LoRAConfig(rank=rank, alpha=2.0 * rank, targets="all-linear"))
    return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps per cell and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--loads", type=int, nargs="+", default=[0, 1, 2], help="busy processes")
    p.add_argument("--ranks", type=int, nargs="+", default=[0, 16], help="0 = full fine-tuning")
    args = p.parse_args()
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 65, (12, 65), generator=gen) for _ in range(args.steps)]
    models = {rank: build(rank) for rank in args.ranks}
    times: dict[tuple[int, int, int], list[float]] = {}
    for load in args.loads:
        busy = [subprocess.Popen(BUSY) for _ in range(load)]
        try:
            time.sleep(0.5)
            for r in range(args.rounds):
                for threads in (1, 2) if r % 2 == 0 else (2, 1):
                    torch.set_num_threads(threads)
                    for rank, (model, opt) in models.items():
                        for x in batches:
                            start = time.perf_counter()
                            logits = model(x[:, :-1]).logits  # (B, T, V)
                            F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten()).backward()
                            opt.step()
                            opt.zero_grad(set_to_none=True)
                            times.setdefault((load, threads, rank), []).append(time.perf_counter() - start)
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
    names = {rank: "full" if rank == 0 else f"LoRA r={rank}" for rank in args.ranks}
    print("| busy processes | torch threads | " + " | ".join(names.values()) + " |")
    print("|---|---|" + "---|" * len(names))
    for load in args.loads:
        for threads in (1, 2):
            cells = [f"{1e3 * statistics.median(times[load, threads, rank]):.0f} ms" for rank in args.ranks]
            print(f"| {load} | {threads} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
