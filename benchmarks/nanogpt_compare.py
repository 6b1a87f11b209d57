"""Benchmark: handformer vs nanoGPT on nanoGPT's published CPU "baby GPT" recipe, side by side.

Runs, in this order and on the same machine: nanoGPT's own train.py with its README's CPU recipe
(tiny Shakespeare, character level, block 64, batch 12, 4 layers, 4 heads, 128 wide, no dropout,
2000 iterations), then `handformer train --config configs/shakespeare_char.toml` (the same recipe),
then `configs/shakespeare_char_modern.toml` (RoPE, RMSNorm, SwiGLU). Prints wall times, final
validation losses and the ratios the project targets:

    same recipe:      val loss <= 1.90 and wall time <= 0.85x nanoGPT's
    time to quality:  modern preset reaches val loss <= 1.88 in <= 0.6x nanoGPT's wall time

nanoGPT is not part of handformer: bring a checkout of its public repository and pass its path.

    python benchmarks/nanogpt_compare.py --nanogpt /path/to/nanoGPT
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def prepare_nanogpt_data(nanogpt: Path, text_path: Path) -> None:
    """Write nanoGPT's shakespeare_char files (train.bin, val.bin, meta.pkl) from the local text,
    in the format its prepare.py produces (which would download the text instead)."""
    text = text_path.read_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    n = len(text)
    out = nanogpt / "data" / "shakespeare_char"
    out.mkdir(parents=True, exist_ok=True)
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    ids[: int(n * 0.9)].tofile(out / "train.bin")
    ids[int(n * 0.9):].tofile(out / "val.bin")
    with open(out / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)


def run_nanogpt(nanogpt: Path, out_dir: Path) -> tuple[float, float]:
    cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
           "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
           "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
           "--lr_decay_iters=2000", "--dropout=0.0", f"--out_dir={out_dir}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=nanogpt, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"nanoGPT failed:\n{proc.stderr[-2000:]}")
    vals = re.findall(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", proc.stdout)
    return wall, float(vals[-1][1])


def run_handformer(config: str, out_dir: Path) -> tuple[float, float, float | None]:
    """(wall time, final val loss, elapsed_s when val loss first <= 1.88)."""
    cmd = [sys.executable, "-m", "handformer", "train", "--config", config, "--out", str(out_dir),
           "--set", "train.progress=false"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"handformer failed:\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    vals = [r for r in records if "val_loss" in r]
    reached = next((r["elapsed_s"] for r in vals if r["val_loss"] <= 1.88), None)
    return wall, vals[-1]["val_loss"], reached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", required=True, type=Path, help="path to a nanoGPT checkout")
    parser.add_argument("--data", type=Path, default=DATA, help="tiny Shakespeare input.txt")
    args = parser.parse_args()
    if not (args.nanogpt / "train.py").is_file():
        raise SystemExit(f"{args.nanogpt} has no train.py: pass the path of a nanoGPT checkout")
    prepare_nanogpt_data(args.nanogpt, args.data)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ng_wall, ng_val = run_nanogpt(args.nanogpt, tmp / "nanogpt")
        print(f"nanoGPT                  wall {ng_wall:6.1f} s   final val loss {ng_val:.3f}", flush=True)
        hf_wall, hf_val, _ = run_handformer("configs/shakespeare_char.toml", tmp / "hf")
        print(f"handformer (same recipe) wall {hf_wall:6.1f} s   final val loss {hf_val:.3f}   "
              f"ratio {hf_wall / ng_wall:.2f}x (target <= 0.85x, val <= 1.90)", flush=True)
        md_wall, md_val, reached = run_handformer("configs/shakespeare_char_modern.toml", tmp / "modern")
        print(f"handformer (modern)      wall {md_wall:6.1f} s   final val loss {md_val:.3f}   "
              f"ratio {md_wall / ng_wall:.2f}x (target: val <= 1.88 in <= 0.6x)", flush=True)
        if reached is not None:
            print(f"  modern preset first reached val loss <= 1.88 after {reached:.1f} s of training "
                  f"({reached / ng_wall:.2f}x nanoGPT's wall time)")


if __name__ == "__main__":
    main()
