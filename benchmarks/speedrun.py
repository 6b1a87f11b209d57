"""Benchmark: the shakespeare speedrun's record configs beside nanoGPT, interleaved, several seeds.

Every round runs, one after the other on this machine: nanoGPT's own train.py with its README's CPU
recipe (tiny Shakespeare characters, block 64, batch 12, 4 layers, 4 heads, 128 wide, 2,000
iterations), then `handformer speedrun shakespeare --config C --seed R` for every record config C.
One definition for all (handformer/speedrun/shakespeare.py):

- wall time: from starting the process to its final checkpoint written (the checkpoint file's
  modification time), imports, data, compilation and evaluations included;
- loss: the final model on the whole validation split in non-overlapping 64-character windows;
  nanoGPT's checkpoint (saved at its last step: --always_save_checkpoint=True) is loaded with
  nanoGPT's own model.py and scored on the same windows as `handformer eval RUN --data val`.

nanoGPT's train.py has a fixed seed (1337), so its rounds differ in time only. Prints one row a
config: mean and sample standard deviation of wall time and loss, the wall-time ratio to nanoGPT,
and whether the row is a record: at least 5 seeds, every one faster than the previous record's
mean wall time, and a mean loss at most nanoGPT's mean (the target loss), or at most the previous
record's mean plus one standard error where that is higher. The target: mean loss <= nanoGPT's
and mean wall time <= 0.30x nanoGPT's. Rows in bf16 run only on a CPU with native bf16
(AVX512-BF16 or AMX) and are compared with the fp32 rows before them; fp32 rows only with fp32.
Run nanoGPT in every round (--nanogpt-runs equal to --seeds) on a machine whose load changes:
each round then shares its load with nanoGPT's run.

nanoGPT is not part of handformer: bring a checkout of its public repository and pass its path
(its data folder gets the character files its prepare.py would download). Tens of minutes: on an
otherwise idle machine, never in CI.

    python benchmarks/speedrun.py --nanogpt /path/to/nanoGPT                       # 5 seeds
    python benchmarks/speedrun.py --nanogpt PATH --configs handformer/configs/speedrun_shakespeare_2*.toml
    python benchmarks/speedrun.py --nanogpt PATH --device cuda --seeds 3            # on a GPU
    python benchmarks/speedrun.py --nanogpt PATH --seeds 3 --json R.json             # rounds 0-2, then
    python benchmarks/speedrun.py --nanogpt PATH --first-seed 3 --seeds 2 --add-to R.json --json R.json

`--add-to` adds the runs of an earlier invocation (its --json file, on the same machine and thread
count, with the same configs) to this one's, so the rounds of a long table can run in several
sittings; each sitting interleaves nanoGPT and every config as one run does.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nanogpt_compare import nanogpt_full_val, prepare_nanogpt_data  # noqa: E402

from handformer.data.lookup import locate  # noqa: E402
from handformer.io import atomic_write_text  # noqa: E402
from handformer.speedrun.common import machine  # noqa: E402
from handformer.training.loop import cpu_has_fast_bf16  # noqa: E402

RECORDS = ROOT / "handformer" / "configs"  # the built-in configs: speedrun_shakespeare_*.toml
NANOGPT = "nanoGPT"
TARGET_RATIO = 0.30
RECORD_SEEDS = 5  # a row with fewer seeds is measured, but never a record


def child_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}


def run_nanogpt(nanogpt: Path, out_dir: Path, threads: int, device: str) -> dict:
    cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", f"--device={device}",
           f"--compile={device != 'cpu'}", "--eval_iters=20", "--log_interval=1", "--block_size=64",
           "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128", "--max_iters=2000",
           "--lr_decay_iters=2000", "--dropout=0.0", "--always_save_checkpoint=True",
           f"--out_dir={out_dir}"]
    start = time.time()
    proc = subprocess.run(cmd, cwd=nanogpt, capture_output=True, text=True, env=child_env(threads))
    if proc.returncode != 0:
        raise SystemExit(f"nanoGPT failed:\n{proc.stderr[-2000:]}")
    wall = (out_dir / "ckpt.pt").stat().st_mtime - start
    loss = nanogpt_full_val(nanogpt, out_dir, locate("tinyshakespeare", "input.txt"))
    return {"wall_s": wall, "loss": loss, "seed": 1337}


def run_handformer(config: str, seed: int, out_dir: Path, threads: int, device: str) -> dict:
    cmd = [sys.executable, "-m", "handformer", "speedrun", "shakespeare", "--config", config,
           "--seed", str(seed), "--out", str(out_dir), "--data", str(locate("tinyshakespeare", "input.txt"))]
    if device != "cpu":
        cmd += ["--set", f"train.device={device}"]
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=child_env(threads))
    if proc.returncode != 0:
        raise SystemExit(f"handformer speedrun {config} failed:\n{proc.stderr[-2000:]}")
    wall = (out_dir / "checkpoint.safetensors").stat().st_mtime - start
    own = json.loads((out_dir / "speedrun.json").read_text())
    return {"wall_s": wall, "loss": own["loss"], "seed": seed, "own_wall_s": own["wall_s"]}


def stats(values: list[float]) -> dict[str, float]:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": sd, "se": sd / math.sqrt(len(values)),
            "min": min(values), "max": max(values), "n": len(values)}


def record_name(config: str) -> str:
    """A built-in record config by its name (speedrun_shakespeare_1_muon), any other by its path."""
    path = Path(config).resolve()
    if path.parent == RECORDS:
        return path.stem
    return os.path.relpath(path, ROOT) if path.is_file() else config


def is_bf16(config: str) -> bool:
    from handformer.tasks.job_file import load_job_file

    return bool(load_job_file(config).get("train", {}).get("bf16", False))


def table(rows: dict[str, list[dict]], bf16: dict[str, bool]) -> tuple[str, list[dict]]:
    """The record table as markdown, and each row's figures (records marked)."""
    base = stats([r["wall_s"] for r in rows[NANOGPT]])["mean"]
    target = stats([r["loss"] for r in rows[NANOGPT]])["mean"]
    out, summary = [], []
    previous = {False: None, True: None}  # the last record in fp32, and in any precision
    for name, runs in rows.items():
        wall, loss = stats([r["wall_s"] for r in runs]), stats([r["loss"] for r in runs])
        half = bf16.get(name, False)
        prev = previous[True] if half else previous[False]
        # the loss a record may reach: the target (nanoGPT's mean), or the previous record's mean
        # plus one standard error where that is higher; a record spends the loss margin on time
        allowed = None if prev is None else max(target, prev["loss"]["mean"] + prev["loss"]["se"])
        record = prev is None or (len(runs) >= RECORD_SEEDS
                                  and all(r["wall_s"] < prev["wall"]["mean"] for r in runs)
                                  and loss["mean"] <= allowed)
        row = {"name": name, "bf16": half, "wall": wall, "loss": loss, "ratio": wall["mean"] / base,
               "record": record, "runs": runs}
        if record:
            previous[True] = row
            if not half:
                previous[False] = row
        summary.append(row)
        out.append(f"| {name} | {'bf16' if half else 'fp32'} | {wall['n']} | {wall['mean']:.1f} ± "
                   f"{wall['std']:.1f} | {row['ratio']:.2f}x | {loss['mean']:.4f} ± {loss['std']:.4f} | "
                   f"{'record' if record else 'no'} |")
    head = ("| run | precision | seeds | wall time (s) | of nanoGPT's | validation loss | record |\n"
            "|---|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(out) + "\n", summary


def earlier_runs(path: Path, configs: list[str], info: dict, device: str,
                 seeds: range) -> dict[str, list[dict]]:
    """The runs of an earlier --json file, checked to be of the same table: one error otherwise."""
    try:
        data = json.loads(path.read_text())
        rows = {r["name"]: list(r["runs"]) for r in data["rows"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--add-to {path}: not a results file of this benchmark ({e})") from None
    keys = ("cpu", "threads")
    same = {k: data.get("machine", {}).get(k) for k in keys} == {k: info[k] for k in keys}
    if not same or data.get("device") != device:
        raise SystemExit(f"--add-to {path}: its runs are from another machine, thread count or device "
                         f"({data.get('machine')}, {data.get('device')}); add only runs measured alike")
    if list(rows) != [NANOGPT, *configs]:
        raise SystemExit(f"--add-to {path}: it holds {', '.join(rows)}; pass the same --configs")
    repeated = sorted({r["seed"] for c in configs for r in rows[c]} & set(seeds))
    if repeated:
        raise SystemExit(f"--add-to {path}: it already has seed(s) {repeated}; start at --first-seed "
                         f"{max(r['seed'] for c in configs for r in rows[c]) + 1}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", required=True, type=Path, help="path to a nanoGPT checkout")
    parser.add_argument("--configs", nargs="+", default=None, metavar="TOML",
                        help="record configs, in the table's order (default: "
                             "the built-in speedrun_shakespeare_* configs, sorted)")
    parser.add_argument("--seeds", type=int, default=5, help="rounds: N seeds of every config")
    parser.add_argument("--first-seed", type=int, default=0, help="the first round's seed (default 0)")
    parser.add_argument("--nanogpt-runs", type=int, default=3, help="nanoGPT in N rounds: the first N, "
                        "or one every --nanogpt-every rounds")
    parser.add_argument("--nanogpt-every", type=int, default=1, metavar="K",
                        help="nanoGPT in every K-th round from the first (default 1: every round)")
    parser.add_argument("--add-to", type=Path, default=None, metavar="JSON",
                        help="an earlier --json file whose runs this one's are added to")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch threads of every run (OMP_NUM_THREADS; default: the machine's cores)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU")
    parser.add_argument("--json", type=Path, default=None, help="also write every run's figures here")
    args = parser.parse_args()
    if args.nanogpt_every < 1 or args.nanogpt_runs < 1:
        raise SystemExit("--nanogpt-every and --nanogpt-runs must be >= 1: every table needs nanoGPT")
    if not (args.nanogpt / "train.py").is_file():
        raise SystemExit(f"{args.nanogpt} has no train.py: pass the path of a nanoGPT checkout")
    configs = [record_name(c) for c in
               args.configs or sorted(glob.glob(str(RECORDS / "speedrun_shakespeare_*.toml")))]
    bf16 = {c: is_bf16(c) for c in configs}
    if args.device == "cpu" and not cpu_has_fast_bf16():
        skipped = [c for c in configs if bf16[c]]
        configs = [c for c in configs if not bf16[c]]
        if skipped:
            print(f"this CPU has no native bf16: skipping {', '.join(skipped)}")
    info = machine()
    info["threads"] = args.threads
    print(f"machine: {info['cpu']}, {info['cores']} cores, flags {' '.join(info['flags'])}; torch "
          f"{info['torch']}, {args.threads} thread(s) for every run; device {args.device}", flush=True)
    rows: dict[str, list[dict]] = {NANOGPT: [], **{c: [] for c in configs}}
    if args.add_to is not None:
        rows = earlier_runs(args.add_to, configs, info, args.device, range(args.first_seed,
                                                                        args.first_seed + args.seeds))
    prepare_nanogpt_data(args.nanogpt, locate("tinyshakespeare", "input.txt"))
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            round_ = seed - args.first_seed
            if round_ % args.nanogpt_every == 0 and round_ // args.nanogpt_every < args.nanogpt_runs:
                r = run_nanogpt(args.nanogpt, Path(tmp) / f"nanogpt{seed}", args.threads, args.device)
                rows[NANOGPT].append(r)
                print(f"round {seed}: {NANOGPT:48} wall {r['wall_s']:6.1f} s  loss {r['loss']:.4f}",
                      flush=True)
            for c in configs:
                r = run_handformer(c, seed, Path(tmp) / f"{Path(c).stem}_{seed}", args.threads, args.device)
                rows[c].append(r)
                print(f"round {seed}: {c:48} wall {r['wall_s']:6.1f} s  loss {r['loss']:.4f}", flush=True)
            if args.json and all(rows.values()):  # every round kept, should a later one be cut short
                atomic_write_text(args.json, json.dumps({"machine": info, "device": args.device,
                                                         "rows": table(rows, bf16)[1]}, indent=1) + "\n")
    text, summary = table(rows, bf16)
    print("\n" + text)
    base = summary[0]
    fp32 = [r for r in summary[1:] if r["record"] and not r["bf16"]]
    for label, best in (("fp32", fp32[-1] if fp32 else None),):
        if best is not None:
            met = best["loss"]["mean"] <= base["loss"]["mean"] and best["ratio"] <= TARGET_RATIO
            print(f"target ({label} record {best['name']}): mean loss {best['loss']['mean']:.4f} vs "
                  f"nanoGPT's {base['loss']['mean']:.4f}, mean wall {best['ratio']:.2f}x nanoGPT's "
                  f"(target <= {TARGET_RATIO:.2f}x): {'met' if met else 'NOT met'}")
    if args.json:
        atomic_write_text(args.json, json.dumps({"machine": info, "device": args.device,
                                                 "rows": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
