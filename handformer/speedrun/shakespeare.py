"""`handformer speedrun shakespeare`: tiny Shakespeare, one token a character, nanoGPT's split.

The definition, the same for every record and for nanoGPT beside them (benchmarks/speedrun.py):
- a record config (`handformer/configs/speedrun_shakespeare_*.toml`, shipped in the package, so
  `--config speedrun_shakespeare_1_muon` works from any folder) trains a fixed number of steps, never
  stopping early on validation;
- wall time runs from the process's start to its final checkpoint written: imports, data,
  compilation and evaluations included;
- the loss is what `handformer eval RUN --data val` prints: the whole validation split (the last
  10% of the text, as nanoGPT splits it) in non-overlapping windows of the training block size.

A config with `train.bf16 = true` runs only on a CPU that multiplies bf16 natively (AVX512-BF16 or
AMX); elsewhere bf16 is emulated and slower than fp32, so such a row means nothing there.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from handformer.speedrun.common import SpeedrunResult, Target, seconds_since_process_start

# The default: the latest sitting's fp32 record, or its fastest fp32 row at nanoGPT's loss while it
# has none (tests/test_speedrun.py holds it to the committed results)
RECORD = "speedrun_shakespeare_4_qk_norm"
VAL_FRACTION = 0.1  # nanoGPT's split: the first 90% trains, the last 10% validates


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=RECORD, help="a record config (default: %(default)s, the best "
                   "fp32 row; the built-in speedrun_shakespeare_* configs are the rows of the record table, "
                   "or a TOML path)")
    p.add_argument("--out", default="runs/speedrun_shakespeare", help="run directory (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="train.seed (initialization and data order)")
    p.add_argument("--data", default=None,
                   help="tiny Shakespeare's input.txt (default: the config's dataset, tinyshakespeare, "
                        "found on this machine or downloaded once: docs/data.md)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a field of the config (the run is then not that record)")
    p.add_argument("--overwrite", action="store_true", help="start over in an existing run directory")


def job_dict(args: argparse.Namespace) -> dict:
    """The record config with the command's seed, data and --set (`args.overrides`) applied,
    checked to be this target's task: characters of tiny Shakespeare split as nanoGPT splits them."""
    from handformer.tasks.job_file import apply_overrides, load_job_file

    job = apply_overrides(load_job_file(args.config), args.overrides)
    job = apply_overrides(job, {"train.seed": args.seed, **({"data.path": args.data} if args.data else {})})
    data = job.get("data", {})
    wrong = [f"{name}={data.get(name)!r} (must be {want!r})" for name, want in
             (("tokenizer", "char"), ("val_fraction", VAL_FRACTION)) if data.get(name) != want]
    if job.get("task") != "lm" or wrong or data.get("shards"):
        raise ValueError(f"{args.config} is not a shakespeare speedrun config: it must train a language "
                         f"model (task = \"lm\") on characters with nanoGPT's split"
                         f"{': ' + ', '.join(wrong) if wrong else ''}")
    return job


def run(args: argparse.Namespace) -> SpeedrunResult:
    from handformer.tasks.lm.job import LMJob
    from handformer.tasks.lm.run import load_lm
    from handformer.tasks.lm.scoring import eval_text, score_text
    from handformer.tasks.lm.train import run_train_lm
    from handformer.training.loop import cpu_has_fast_bf16, pick_device
    from handformer.training.run_lock import run_lock
    from handformer.training.tensorboard import check_loggers

    raw = job_dict(args)
    job = LMJob.from_dict({k: v for k, v in raw.items() if k != "task"})
    check_loggers(job.train.log)
    if job.train.bf16 and pick_device(job.train.device).type == "cpu" and not cpu_has_fast_bf16():
        raise ValueError(f"{args.config} trains in bf16, and this CPU has no native bf16 (neither "
                         f"AVX512-BF16 nor AMX): bf16 is emulated here and slower than fp32; run the "
                         f"fp32 default ({RECORD}) instead")
    out = Path(args.out)
    if (out / "checkpoint.safetensors").exists() and not args.overwrite:
        raise ValueError(f"{out} already holds a run; use --overwrite to start over, or another --out")
    with run_lock(out):
        _, result = run_train_lm(job, out)
        wall = seconds_since_process_start()  # the final checkpoint is written
        lm = load_lm(out)
        loss = score_text(lm, eval_text(lm, "val")).loss
        outcome = SpeedrunResult("shakespeare", str(args.config), args.seed, round(wall, 3), loss,
                                 result.step)
        path = outcome.write(out)
    print(f"speedrun shakespeare: {args.config}, seed {args.seed}: {result.step} steps, wall "
          f"{wall:.1f} s from process start to the final checkpoint, validation loss {loss:.4f} "
          f"(the whole split, as `handformer eval {out} --data val`); {path}")
    return outcome


TARGET = Target("shakespeare", "tiny Shakespeare characters: nanoGPT's loss in less of its time",
                add_arguments, run)
