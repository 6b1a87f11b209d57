"""Benchmark: handformer vs nanoGPT on nanoGPT's published CPU "baby GPT" recipe, side by side.

Runs, in this order and on the same machine: nanoGPT's own train.py with its README's CPU recipe
(tiny Shakespeare, character level, block 64, batch 12, 4 layers, 4 heads, 128 wide, no dropout,
2000 iterations), then `handformer train --config configs/shakespeare_char.toml` (the same recipe),
then `configs/shakespeare_char_modern.toml` (RoPE, RMSNorm, SwiGLU). Prints wall times, final
validation losses and the ratios the project targets:

    same recipe:      val loss <= 1.90 and wall time <= 0.85x nanoGPT's
    time to quality:  modern preset reaches val loss <= 1.88 in <= 0.6x nanoGPT's wall time

Threads are matched: both trainings run as child processes with OMP_NUM_THREADS=--threads (default:
this machine's cores, torch's own default), which fixes torch's intra-op threads in each; the
in-process step timing (--steps-only) runs both models on the same torch threads.

nanoGPT is not part of handformer: bring a checkout of its public repository and pass its path.

    python benchmarks/nanogpt_compare.py --nanogpt /path/to/nanoGPT
    python benchmarks/nanogpt_compare.py --nanogpt /path/to/nanoGPT --steps-only   # model step only
    python benchmarks/nanogpt_compare.py --nanogpt /path/to/nanoGPT --seeds 4      # + seeds 1..3
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


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


def child_env(threads: int) -> dict[str, str]:
    """The environment of a training child process: torch's intra-op threads fixed at `threads`."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads)}


def run_nanogpt(nanogpt: Path, out_dir: Path, threads: int) -> tuple[float, float]:
    cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
           "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
           "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
           "--lr_decay_iters=2000", "--dropout=0.0", f"--out_dir={out_dir}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=nanogpt, capture_output=True, text=True, env=child_env(threads))
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"nanoGPT failed:\n{proc.stderr[-2000:]}")
    vals = re.findall(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", proc.stdout)
    return wall, float(vals[-1][1])


def nanogpt_full_val(nanogpt: Path, out_dir: Path, text_path: Path) -> float:
    """nanoGPT's saved checkpoint (its best, as it saves only on improvement), loaded with nanoGPT's
    own model code, on the windows `handformer eval --data val` scores: the whole validation split
    as handformer cuts it, in non-overlapping 64-character windows (one character = one token in
    both, so the windows hold the same text)."""
    sys.path.insert(0, str(nanogpt))
    from model import GPT, GPTConfig  # nanoGPT's model.py

    from handformer.data.text import split_text, validation_batches

    ckpt = torch.load(out_dir / "ckpt.pt", map_location="cpu", weights_only=False)
    model = GPT(GPTConfig(**ckpt["model_args"]))
    model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
    model.eval()
    with open(nanogpt / "data" / "shakespeare_char" / "meta.pkl", "rb") as f:
        stoi = pickle.load(f)["stoi"]
    _, val_text = split_text(text_path.read_text(), 0.1)
    ids = torch.tensor([stoi[c] for c in val_text])
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in validation_batches(ids, ckpt["model_args"]["block_size"], 64):
            logits = model(batch.x, batch.y.contiguous())[0]  # (B, T, V): all of them, given targets
            total += F.cross_entropy(logits.flatten(0, 1), batch.y.flatten(), reduction="sum").item()
            count += batch.n_tokens
    return total / count


def handformer_full_val(run_dir: Path, text_path: Path) -> float:
    """handformer's best checkpoint (model.safetensors) on the whole validation split: what
    `handformer eval RUN_DIR --data val` prints."""
    from handformer.data.text import split_text
    from handformer.tasks.lm.run import load_lm
    from handformer.tasks.lm.scoring import score_text

    _, val_text = split_text(text_path.read_text(), 0.1)
    return score_text(load_lm(run_dir), val_text).loss


PHASES = ("forward", "backward", "clip", "AdamW")


def step_times(nanogpt: Path, rounds: int = 6, steps: int = 50) -> dict[str, dict[str, float]]:
    """Median ms of each phase of a training step (forward with the loss, backward, clip, AdamW
    with zero_grad) and of the whole step, of the same-recipe model in handformer and in nanoGPT's
    model.py, in this one process, rounds interleaved, same batch. nanoGPT's own optimizer setup
    (its configure_optimizers) is used for it: on CPU that is the non-fused AdamW."""
    sys.path.insert(0, str(nanogpt))
    from model import GPT, GPTConfig  # nanoGPT's model.py

    from handformer.models.causal_lm import CausalLM
    from handformer.tasks.job_file import load_job_file
    from handformer.tasks.lm.job import LMJob
    from handformer.training.loop import clip_gradients, make_optimizer

    raw = load_job_file(ROOT / "configs" / "shakespeare_char.toml")
    job = LMJob.from_dict({k: v for k, v in raw.items() if k != "task"})
    V = 65  # tiny Shakespeare's characters
    torch.manual_seed(0)
    ours = CausalLM(job.model_config(V))
    ours_opt = make_optimizer(ours, job.train, torch.device("cpu"))
    theirs = GPT(GPTConfig(block_size=64, vocab_size=V, n_layer=4, n_head=4, n_embd=128,
                           dropout=0.0, bias=False))
    theirs_opt = theirs.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    batch = torch.randint(0, V, (12, 65))
    x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()  # (12, 64) each

    def ours_loss() -> torch.Tensor:
        logits = ours(x).logits  # (12, 64, V)
        return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))

    def theirs_loss() -> torch.Tensor:
        return theirs(x, y)[1]

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn) -> list[float]:
        t0 = time.perf_counter()
        loss = loss_fn()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if model is ours:  # each as its own loop clips
            clip_gradients(model, 1.0, torch.device("cpu"))
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        t4 = time.perf_counter()
        return [t1 - t0, t2 - t1, t3 - t2, t4 - t3]

    runs = {"handformer": (ours, ours_opt, ours_loss), "nanoGPT": (theirs, theirs_opt, theirs_loss)}
    times: dict[str, list[list[float]]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, args in runs.items():
            for _ in range(5):  # warm-up
                step(*args)
            times[name] += [step(*args) for _ in range(steps)]
    result = {}
    for name, rows in times.items():
        result[name] = {phase: statistics.median(r[i] for r in rows) * 1000 for i, phase in enumerate(PHASES)}
        result[name]["step"] = statistics.median(sum(r) for r in rows) * 1000
    return result


def run_handformer(config: str, out_dir: Path, text_path: Path, threads: int, seed: int | None = None,
                   ) -> tuple[float, float, float | None]:
    """(wall time, final val loss, elapsed_s when val loss first <= 1.88)."""
    cmd = [sys.executable, "-m", "handformer", "train", "--config", config, "--out", str(out_dir),
           "--set", "train.progress=false", "--set", f"data.path={text_path.resolve()}"]
    if seed is not None:
        cmd += ["--set", f"train.seed={seed}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=child_env(threads))
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
    parser.add_argument("--data", type=Path, default=None,
                        help="tiny Shakespeare input.txt (default: the dataset, docs/data.md)")
    parser.add_argument("--steps-only", action="store_true",
                        help="only time one training step of each model, in this process")
    parser.add_argument("--seeds", type=int, default=1,
                        help="also train the same recipe with seeds 1..N-1 (the loss's spread)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads of every side (default: the machine's cores)")
    args = parser.parse_args()
    if args.data is None:
        from handformer.data.lookup import locate

        args.data = locate("tinyshakespeare", "input.txt")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s) for every side")
    if not (args.nanogpt / "train.py").is_file():
        raise SystemExit(f"{args.nanogpt} has no train.py: pass the path of a nanoGPT checkout")
    if args.steps_only:
        ms = step_times(args.nanogpt)
        print("one training step, same batch, in-process, medians over 6 rounds of 50 steps (ms):")
        print(f"{'':12}" + "".join(f"{phase:>10}" for phase in (*PHASES, "step")))
        for name, row in ms.items():
            print(f"{name:12}" + "".join(f"{row[phase]:10.2f}" for phase in (*PHASES, "step")))
        print(f"ratio handformer / nanoGPT: {ms['handformer']['step'] / ms['nanoGPT']['step']:.2f}")
        return
    prepare_nanogpt_data(args.nanogpt, args.data)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ng_wall, ng_val = run_nanogpt(args.nanogpt, tmp / "nanogpt", args.threads)
        print(f"nanoGPT                  wall {ng_wall:6.1f} s   final val loss {ng_val:.3f}", flush=True)
        hf_wall, hf_val, _ = run_handformer("configs/shakespeare_char.toml", tmp / "hf", args.data,
                                         args.threads)
        print(f"handformer (same recipe) wall {hf_wall:6.1f} s   final val loss {hf_val:.3f}   "
              f"ratio {hf_wall / ng_wall:.2f}x (target <= 0.85x, val <= 1.90)", flush=True)
        # Each tool's own val loss is an estimate on 20 batches (nanoGPT's are random, ours fixed);
        # one yardstick for both: every non-overlapping 64-character window of the split.
        ng_full = nanogpt_full_val(args.nanogpt, tmp / "nanogpt", args.data)
        hf_full = handformer_full_val(tmp / "hf", args.data)
        print(f"whole validation split, same windows: nanoGPT {ng_full:.3f}   "
              f"handformer (same recipe) {hf_full:.3f}", flush=True)
        md_wall, md_val, reached = run_handformer("configs/shakespeare_char_modern.toml", tmp / "modern",
                                                  args.data, args.threads)
        print(f"handformer (modern)      wall {md_wall:6.1f} s   final val loss {md_val:.3f}   "
              f"ratio {md_wall / ng_wall:.2f}x (target: val <= 1.88 in <= 0.6x)", flush=True)
        md_full = handformer_full_val(tmp / "modern", args.data)
        print(f"  modern preset on the whole validation split: {md_full:.3f}")
        if reached is not None:
            print(f"  modern preset first reached val loss <= 1.88 after {reached:.1f} s of training "
                  f"({reached / ng_wall:.2f}x nanoGPT's wall time)", flush=True)
        for seed in range(1, args.seeds):
            run_dir = tmp / f"seed{seed}"
            wall, val, _ = run_handformer("configs/shakespeare_char.toml", run_dir, args.data, args.threads,
                                          seed)
            full = handformer_full_val(run_dir, args.data)
            print(f"handformer (same recipe, seed {seed}) wall {wall:6.1f} s ({wall / ng_wall:.2f}x)   "
                  f"final val loss {val:.3f}   whole split {full:.3f}", flush=True)


if __name__ == "__main__":
    main()
