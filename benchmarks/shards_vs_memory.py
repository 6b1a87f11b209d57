"""Training from memory-mapped shards vs from an in-memory tensor, side by side.

The same tokens two ways: `handformer prepare` shards of a corpus (default: tiny Shakespeare,
characters, shards of 100,000 tokens) read through `ShardWindows` (random windows, each batch
gathered from the memory-mapped files), and the same training tokens held in one tensor read
through `LMWindows` (what a `data.path` job uses). For each, the same model (nanoGPT's baby GPT:
4 layers, 128 wide, block 64, batch 12) trains with the project's loop (`training.loop.train`,
AdamW, clipping, no evaluation), rounds interleaved; the script prints the median seconds per
step of each, their ratio, and the time to draw one batch alone.

    python benchmarks/shards_vs_memory.py
    python benchmarks/shards_vs_memory.py --shards OUT_DIR   # any prepared folder
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.data.lookup import locate  # noqa: E402
from handformer.data.prepare import prepare  # noqa: E402
from handformer.data.shards import ShardSet, ShardWindows  # noqa: E402
from handformer.data.text import LMWindows  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.tasks.lm.train import lm_loss  # noqa: E402
from handformer.training.loop import TrainConfig, train  # noqa: E402

BLOCK, BATCH = 64, 12


def train_seconds(source, vocab: int, steps: int, work: Path) -> float:
    torch.manual_seed(0)
    cfg = CausalLMConfig.from_dict({**CausalLMConfig.gpt2_style().to_dict(), "vocab_size": vocab,
                                    "d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 4,
                                    "max_positions": BLOCK, "dropout": 0.0, "bias": False,
                                    "activation": "gelu"}, "model")
    model = CausalLM(cfg)
    tc = TrainConfig(steps=steps, lr=1e-3, schedule="cosine", warmup=10, label_smoothing=0.0,
                     eval_every=10 * steps, progress=False, seed=0)
    return train(model, tc, source, None, lm_loss, work).elapsed_s / steps


def batch_seconds(source, n: int = 200) -> float:
    epoch = source.epoch(0)
    start = time.perf_counter()
    for i in range(n):
        epoch[i]
    return (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", help="a prepared folder (default: prepare tiny Shakespeare)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="shards_vs_memory_"))
    folder = Path(args.shards) if args.shards else work / "shards"
    if not args.shards:
        prepare(locate("tinyshakespeare", "input.txt"), folder, "char",
                shard_tokens=100_000, progress=False)
    shards = ShardSet.open(folder)
    vocab = shards.manifest["tokenizer"]["vocab_size"]
    tokens = torch.from_numpy(np.concatenate([np.asarray(s.tokens) for s in shards.train]).astype(np.int32))
    sources = {
        "in-memory tensor (LMWindows)": LMWindows(tokens, BLOCK, BATCH, 1000, seed=0),
        "memory-mapped shards (ShardWindows)": ShardWindows(shards.train, BLOCK, BATCH, vocab, "random",
                                                            1000, seed=0),
    }
    print(f"{len(tokens):,} training tokens in {len(shards.train)} shards; {args.rounds} interleaved "
          f"rounds of {args.steps} steps each")
    times: dict[str, list[float]] = {name: [] for name in sources}
    for r in range(args.rounds):
        for name, source in sources.items():
            times[name].append(train_seconds(source, vocab, args.steps, work / f"run{r}"))
            print(f"round {r + 1}: {name}: {1000 * times[name][-1]:.2f} ms/step", flush=True)
    memory, mapped = (statistics.median(times[n]) for n in sources)
    for name in sources:
        print(f"{name}: median {1000 * statistics.median(times[name]):.2f} ms/step; one batch alone "
              f"{1e6 * batch_seconds(sources[name]):.0f} us")
    print(f"shards / in-memory step time: {mapped / memory:.3f}")


if __name__ == "__main__":
    main()
