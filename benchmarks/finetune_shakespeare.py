"""Measure fine-tuning on tiny Shakespeare: full vs LoRA at two ranks, from up to three bases.

Bases (built once, kept in OUT; `--bases` picks them):
- `stories260K`: llama2.c's real model trained on TinyStories (260K parameters, a 512-token
  sentencepiece tokenizer with byte fallback), imported with `handformer import-llama2c` from
  the stories260K dataset (found or fetched as docs/data.md says);
- `gpt2`: the baby GPT of configs/shakespeare_char.toml (GPT-2 style, 0.8M parameters) trained on
  Python's reference documentation (the embedded pydoc corpus) instead of Shakespeare, so that
  fine-tuning has a style to shift;
- `llama`: a tiny random Llama (RoPE, RMSNorm, SwiGLU, grouped-query attention) saved by
  transformers' save_pretrained with the gpt2 base's character tokenizer and imported with
  `handformer import-hf`, as any Hugging Face checkpoint would be.

Each base is fine-tuned with `handformer train --init-from BASE` on tiny Shakespeare (windows of
64 characters for the character-level bases, of 128 tokens for stories260K; batches of 12),
fully and with LoRA on every linear layer of the blocks ("all-linear") at two ranks. For each run:
validation loss on the whole Shakespeare validation split (the last 10%) before and after (what
`handformer eval RUN --data val` prints), wall time of the training loop and its median tokens/s
over the logged 50-step windows, trainable parameters, and the command's peak resident memory;
then samples of the bases before and after. Every run trains with `--threads` torch threads
(train.threads; default 1: on a machine shared with other jobs a second thread makes every step
wait for a descheduled thread, see the README).

    python benchmarks/finetune_shakespeare.py --out runs/finetune
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.data.lookup import folder, locate  # noqa: E402
from handformer.data.text import load_text, split_text  # noqa: E402
from handformer.tasks.lm.run import load_lm  # noqa: E402
from handformer.tasks.lm.scoring import score_text  # noqa: E402

BASES = ("stories260K", "gpt2", "llama")
BLOCK = {"stories260K": 128, "gpt2": 64, "llama": 64}  # tokens per training and scoring window
# Runs the command line in a child process and prints its peak resident memory at exit.
PEAK = ("import atexit, resource, runpy, sys; atexit.register(lambda: print('peak RSS %.0f MB' % "
        "(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), file=sys.stderr)); "
        "sys.argv = ['handformer'] + sys.argv[1:]; runpy.run_module('handformer', run_name='__main__')")


def handformer(*args: str) -> tuple[str, float, float]:
    """Run `handformer ARGS`; returns (stdout, wall seconds, peak RSS in MB)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PEAK, *args], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"handformer {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    peak = float(re.search(r"peak RSS (\d+) MB", proc.stderr).group(1))
    return proc.stdout, wall, peak


def make_llama(out: Path, tokenizer: Path, seed: int) -> None:
    """A tiny random Llama in Hugging Face's format, imported with `handformer import-hf`."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from handformer.data.tokenizer import Tokenizer

    vocab = Tokenizer.load(tokenizer).vocab_size
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=352, num_hidden_layers=4, max_position_embeddings=256,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    hf_dir = out.with_name(out.name + "_hf")
    hf.save_pretrained(hf_dir, safe_serialization=True)
    shutil.copy(tokenizer, hf_dir / "tokenizer.json")
    handformer("import-hf", str(hf_dir), str(out), "--overwrite")


def loop_time(run_dir: Path) -> tuple[float, float]:
    """The training loop's wall time (evaluations included) and its median training speed over
    the logged windows of steps: on a shared machine the median shrugs off the windows in which
    another job ran, the wall time does not."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows[-1]["elapsed_s"], statistics.median(r["tokens_per_s"] for r in rows if "tokens_per_s" in r)


def val_loss(run_dir: Path, val_text: str, block: int) -> float:
    return score_text(load_lm(run_dir), val_text, block_size=block).loss


def build_bases(names: list[str], out: Path, args: argparse.Namespace) -> dict[str, Path]:
    """The base runs named, built where missing (llama needs gpt2's tokenizer)."""
    bases = {name: out / f"base_{name}" for name in names}
    gpt2 = out / "base_gpt2"
    if ("gpt2" in names or "llama" in names) and not (gpt2 / "model.safetensors").is_file():
        handformer("train", "--config", "configs/shakespeare_char.toml", "--out", str(gpt2),
                   "--overwrite", "--set", "data.path=pydoc", "--set", f"train.steps={args.base_steps}",
                   "--set", "train.progress=false", "--set", f"train.seed={args.seed}",
                   "--set", f"train.threads={args.threads}")
    if "llama" in names and not (bases["llama"] / "model.safetensors").is_file():
        make_llama(bases["llama"], gpt2 / "tokenizer.json", args.seed)
    if "stories260K" in names and not (bases["stories260K"] / "model.safetensors").is_file():
        stories = folder("stories260K")
        handformer("import-llama2c", str(stories / "stories260K.bin"), str(stories / "tok512.bin"),
                   str(bases["stories260K"]), "--overwrite")
    return bases


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/finetune")
    p.add_argument("--base-steps", type=int, default=1000, help="training steps of the gpt2 base")
    p.add_argument("--steps", type=int, default=500, help="fine-tuning steps of every run")
    p.add_argument("--ranks", type=int, nargs=2, default=[4, 16])
    p.add_argument("--full-lr", type=float, default=1e-3)
    p.add_argument("--lora-lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bases", nargs="+", choices=BASES, default=list(BASES))
    p.add_argument("--threads", type=int, default=1, help="train.threads of every run (0: torch's default)")
    args = p.parse_args()
    out = (ROOT / args.out).resolve()
    bases = build_bases(args.bases, out, args)

    shakespeare = locate("tinyshakespeare", "input.txt")
    val_text = split_text(load_text(str(shakespeare)), 0.1)[1]
    common = ["--set", f"data.path={shakespeare}", "--set", "data.batch_size=12", "--set",
              f"train.threads={args.threads}", "--set", "data.eval_batches=20", "--set",
              f"train.steps={args.steps}",
              "--set", "train.warmup=50", "--set", f"train.eval_every={args.steps // 2}", "--set",
              "train.log_every=50", "--set", "train.progress=false", "--set", f"train.seed={args.seed}",
              "--set", "train.weight_decay=0.1", "--set", "train.beta2=0.99"]
    variants = {"full": ["--set", f"train.lr={args.full_lr}", "--set", f"train.min_lr={args.full_lr / 10}"]}
    for rank in args.ranks:
        variants[f"LoRA r={rank}"] = ["--set", f"train.lr={args.lora_lr}", "--set",
                                      f"train.min_lr={args.lora_lr / 10}", "--set", f"train.lora.rank={rank}",
                                      "--set", f"train.lora.alpha={2 * rank}", "--set",
                                      "train.lora.targets=all-linear"]
    rows = []
    for base_name, base in bases.items():
        block = BLOCK[base_name]
        before = val_loss(base, val_text, block)
        for name, extra in variants.items():
            run = out / f"{base_name}_{name.replace(' ', '_').replace('=', '')}"
            log, wall, peak = handformer("train", "--init-from", str(base), "--out", str(run), "--overwrite",
                                         *common, "--set", f"data.block_size={block}", *extra)
            unknown = re.findall(r"warning: .*unknown.*", log)
            if unknown:
                print("\n".join(unknown))
            params = re.search(r"model: ([\d,]+) parameters(?: \(([\d,]+) trainable\))?", log)
            trainable = params.group(2) or params.group(1)
            loop_s, speed = loop_time(run)
            after = val_loss(run, val_text, block)
            rows.append((base_name, name, params.group(1), trainable, before, after, loop_s, speed, peak))
            print(f"{base_name} {name}: val {before:.4f} -> {after:.4f}, loop {loop_s:.1f} s "
                  f"(command {wall:.1f} s, median {speed:,.0f} tokens/s), {trainable} of "
                  f"{params.group(1)} parameters trained, peak RSS {peak:.0f} MB", flush=True)

    print("\n| base | fine-tuning | trainable parameters | val loss before | after | training wall "
          "time | median tokens/s | peak memory (RSS) |\n|---|---|---|---|---|---|---|---|")
    for base_name, name, total, trainable, before, after, loop_s, speed, peak in rows:
        label = f"{base_name} ({total})" if name == "full" else base_name
        print(f"| {label} | {name} | {trainable} | {before:.4f} | {after:.4f} | {loop_s:.1f} s "
              f"| {speed:,.0f} | {peak:.0f} MB |")
    prompt = ["--prompt", "ROMEO:", "--max-new-tokens", "58", "--temperature", "0.8", "--seed", "1"]
    for base_name in ("stories260K", "gpt2"):
        if base_name in bases:
            lora = out / f"{base_name}_LoRA_r{args.ranks[1]}"
            for run in (bases[base_name], out / f"{base_name}_full", lora):
                text, _, _ = handformer("generate", str(run), *prompt)
                print(f"\n--- {run.name}:\n{text.strip()}")


if __name__ == "__main__":
    main()
