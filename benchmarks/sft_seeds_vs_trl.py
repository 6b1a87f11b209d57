"""Benchmark: handformer's SFT against TRL's SFTTrainer on a `trl_recipe.py` comparison, step by
step and seed by seed, from the same base, data file and settings (OUT/handformer/{base,data,sft}).

    lockstep  the batches TRL's trainer steps on (its own loop, recorded with empty steps), then N
              steps of TRL and N steps of handformer's loop on those batches at TRL's learning
              rates (step k at handformer's rate of step k - 1, step 0 at 0): each step's loss and
              gradient norm on both sides
    seeds     SFT runs at other training seeds (data order; the data file unchanged) on one side
              (handformer, trl, or `stream`: handformer's loop on TRL's batches at TRL's rates),
              each scored greedy on --long-n held-out long sums of the preset's search split
    chain     from each seed's SFT models (seed 0: OUT's; others: the `seeds` runs of both sides),
              trl_recipe's DPO then GRPO on each side at that training seed, into
              OUT/chain/sSEED/{handformer,trl} (a stage whose model is there already is kept), and
              every stage scored as `seeds` scores; both DPO stages learn the pairs rejected by
              handformer's SFT model of the seed; OUT/chain/sSEED/results.json holds the figures

    python benchmarks/sft_seeds_vs_trl.py lockstep runs/trl-recipe-mid --steps 120
    python benchmarks/sft_seeds_vs_trl.py seeds runs/trl-recipe-mid --side handformer --seeds 1 2
    python benchmarks/sft_seeds_vs_trl.py chain runs/trl-recipe-mid --seeds 1 2

Needs `trl` (a dev dependency). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trl_recipe  # noqa: E402

from handformer.generation.chat_template import TEMPLATE_FILE  # noqa: E402
from handformer.io import atomic_write_text  # noqa: E402
from handformer.tasks.lm.imports import import_hf  # noqa: E402
from handformer.tasks.post.job import PostJob  # noqa: E402
from handformer.tasks.post.packing import SFTBatch, SFTExample, pack_windows, packed_batch  # noqa: E402
from handformer.tasks.post.setup import builder  # noqa: E402
from handformer.tasks.post.sft import sft_batches, sft_loss  # noqa: E402
from handformer.tasks.post.train import run_post  # noqa: E402
from handformer.tasks.speedrun_chat import pipeline  # noqa: E402
from handformer.tasks.speedrun_chat.reasoning import LONG_KIND, ReasoningSet  # noqa: E402
from handformer.tasks.speedrun_chat.scoring import evaluate_reasoning  # noqa: E402
from handformer.training import loop  # noqa: E402


def sft_config(out: Path, seed: int) -> dict:
    """The handformer SFT run's config.json, at training seed `seed`."""
    config = json.loads((out / "handformer" / "sft" / "config.json").read_text())
    config["train"]["seed"] = seed
    config["init_from_dir"] = str(out / "handformer" / "base")
    return config


def trl_trainer(out: Path, seed: int, work: Path, every_step: bool = False):
    """trl_recipe's SFTTrainer of the comparison in OUT, at `seed`."""
    config = sft_config(out, seed)
    if every_step:
        config["train"]["log_every"] = 1
    lines = (out / "handformer" / "data" / "sft.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    trainer = trl_recipe.trainer_for("sft", config, out / "trl" / "base_hf", work, records)
    if every_step:  # no evaluation, no checkpoints: the steps alone
        trainer.args.eval_strategy, trainer.args.save_strategy = "no", "no"
        trainer.args.load_best_model_at_end = False
    return trainer


def trl_stream(out: Path, seed: int, work: Path) -> list[dict]:
    """The batches TRL's trainer steps on, in order: its loop run with steps that record and learn nothing."""
    trainer, seen = trl_trainer(out, seed, work, every_step=True), []

    def record(model, inputs, num_items_in_batch=None):
        seen.append({k: inputs[k].clone() for k in ("input_ids", "labels", "position_ids")})
        return torch.zeros(())

    trainer.training_step = record
    trainer.train()
    return seen


def as_windows(batch: dict, block_size: int) -> SFTBatch:
    """TRL's padding-free batch (one row, positions restarting at each conversation) as handformer's
    packed windows: the conversations in order, x = ids[:-1], y = labels[1:]."""
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [len(ids)]
    docs = [SFTExample(ids[a:b - 1], labels[a + 1:b]) for a, b in zip(starts[:-1], starts[1:])]
    return packed_batch(pack_windows(docs, block_size, 0, best_fit=False))


handformer_rate = loop.learning_rate


def trl_rates(step: int, *args) -> float:
    """TRL's warmup starts at 0: its step k takes handformer's rate of step k - 1."""
    return 0.0 if step == 0 else handformer_rate(step - 1, *args)


class StreamEnd(Exception):
    """The recorded batches are used up: a shortened run's steps are done."""


def train_on_stream(out: Path, stream: list[dict], run_dir: Path, steps: int | None = None) -> Path:
    """handformer's SFT loop on TRL's batches, at TRL's learning rates; `steps` (fewer than the
    run's) stops it early, logging every step, without validation."""
    config = sft_config(out, 0)
    train = {**config["train"], **({"log_every": 1} if steps else {})}
    job = PostJob.from_dict({"task": "sft", "train": train, "data": config["data"]})
    batches = [as_windows(b, job.block_size) for b in stream[:steps or len(stream)]]

    class Stream:
        def epoch(self, epoch: int) -> list[SFTBatch]:
            if epoch:
                raise StreamEnd
            return batches

    _, val = sft_batches(job, run_dir, False)
    with mock.patch.object(loop, "learning_rate", trl_rates):
        try:
            loop.train_new_model(builder(job, run_dir, False), job.train, Stream(), None if steps else val,
                                 sft_loss, run_dir)
        except StreamEnd:
            pass
    return run_dir


def lockstep(out: Path, steps: int, work: Path) -> None:
    stream = trl_stream(out, 0, work / "stream")
    trainer = trl_trainer(out, 0, work / "trl", every_step=True)
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step >= steps

    trainer.add_callback(Stop())
    trainer.train()
    theirs = [h for h in trainer.state.log_history if "loss" in h]
    run = train_on_stream(out, stream, work / "handformer", steps)
    ours = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    print("| step | TRL loss | handformer loss | relative difference | TRL grad norm | "
          "handformer grad norm |")
    print("|---:|---:|---:|---:|---:|---:|")
    for t, h in zip(theirs, ours):
        gap = abs(float(t["loss"]) - h["train_loss"]) / float(t["loss"])
        print(f"| {t['step']} | {float(t['loss']):.6f} | {h['train_loss']:.6f} | {gap:.1e} | "
              f"{float(t['grad_norm']):.5f} | {h['grad_norm']:.5f} |")


def train_seed(out: Path, side: str, seed: int, run_dir: Path) -> float:
    """One SFT run of `side` at training seed `seed` into run_dir (a handformer run); its seconds."""
    shutil.rmtree(run_dir, ignore_errors=True)
    start = time.perf_counter()
    if side == "handformer":
        config = sft_config(out, seed)
        job = PostJob.from_dict({"task": "sft", "train": config["train"], "data": config["data"]})
        run_post(job, run_dir)
    elif side == "stream":
        stream = trl_stream(out, seed, run_dir.with_name(run_dir.name + "-work"))
        start = time.perf_counter()
        train_on_stream(out, stream, run_dir)
    else:
        trainer = trl_trainer(out, seed, run_dir.with_name(run_dir.name + "-work"))
        trainer.train()
        trainer.save_model(str(run_dir.with_name(run_dir.name + "-hf")))
        seconds = time.perf_counter() - start
        import_hf(run_dir.with_name(run_dir.name + "-hf"), run_dir)
        shutil.copyfile(out / "handformer" / "base" / TEMPLATE_FILE, run_dir / TEMPLATE_FILE)
        return seconds
    return time.perf_counter() - start


CHAIN = ("handformer/dpo", "trl/dpo", "handformer/grpo", "trl/grpo")


def chain_folder(out: Path, seed: int) -> Path:
    """OUT/chain/sSEED laid out as a trl_recipe comparison: the shared base, each side's SFT model of
    the seed (linked), and the stages chained from them."""
    folder, seeds = out / "chain" / f"s{seed}", out / "sft-seeds"
    sources = {"handformer/base": out / "handformer" / "base",
               "handformer/sft": out / "handformer" / "sft" if seed == 0 else seeds / f"handformer-s{seed}",
               "trl/sft_hf": out / "trl" / "sft_hf" if seed == 0 else seeds / f"trl-s{seed}-hf"}
    for name, source in sources.items():
        if not (source / "config.json").is_file():
            raise FileNotFoundError(f"{source} has no model: run `seeds --side "
                                    f"{name.split('/')[0]} --seeds {seed}` first")
        link = folder / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(source.resolve())
    return folder


def chain_step(step: str, cfg, folder: Path, seed: int) -> float:
    """One stage of CHAIN in `folder`, trained at training seed `seed` (TRL's reads it from
    handformer's config.json of the stage); the data as trl_recipe writes it; its seconds."""
    side, _, stage = step.partition("/")
    if side == "trl":
        return trl_recipe.trl_step(stage, cfg, folder, print)
    mine = folder / "handformer"
    previous = mine / ("sft" if stage == "dpo" else "dpo")
    problems = ReasoningSet(cfg.seed, pipeline.difficulty(cfg))
    records, _ = pipeline.stage_records(stage, cfg, problems, previous)
    path = pipeline.write_jsonl(mine / "data" / f"{stage}.jsonl", records)
    shutil.rmtree(mine / stage, ignore_errors=True)
    start = time.perf_counter()
    pipeline.train_post_stage(stage, dataclasses.replace(cfg, seed=seed), previous, mine, path, print)
    return time.perf_counter() - start


def chain(out: Path, seed: int, cfg, held: list) -> None:
    """CHAIN from seed `seed`'s SFT models, each stage scored on `held` (the SFT models are scored by
    `seeds`); the figures in results.json."""
    folder = chain_folder(out, seed)
    path = folder / "results.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    for step in CHAIN:
        if step in results:
            continue
        trained = (folder / step / "model.safetensors").is_file()
        seconds = None if trained else round(chain_step(step, cfg, folder, seed), 1)
        greedy = evaluate_reasoning(folder / step, held, 0, 1.0, cfg.grpo_max_new_tokens, cfg.seed)["greedy"]
        results[step] = {"train_s": seconds, "greedy": greedy}
        atomic_write_text(path, json.dumps(results, indent=2) + "\n")
        took = "kept" if seconds is None else f"trained in {seconds:.0f} s"
        print(f"seed {seed} {step}: {100 * greedy['value']:.1f}% of {greedy['n']} long sums ({took})")


def welch(ours: list[float], theirs: list[float]) -> float:
    """The difference of the means in standard errors of the difference, the spread between seeds
    counted (Welch): each side's sample variance over its number of runs."""
    spread = math.sqrt(statistics.variance(ours) / len(ours) + statistics.variance(theirs) / len(theirs))
    return (statistics.mean(ours) - statistics.mean(theirs)) / spread


def chain_table(out: Path) -> str:
    """Every chained seed's figures in OUT/chain, a stage a line: each side's runs, mean and the gap."""
    runs = {int(p.parent.name[1:]): json.loads(p.read_text())
            for p in sorted((out / "chain").glob("s*/results.json"))}
    lines = []
    for stage in ("dpo", "grpo"):
        cells, means = [], []
        for side in ("handformer", "trl"):
            figures = {seed: 100 * r[f"{side}/{stage}"]["greedy"]["value"]
                       for seed, r in sorted(runs.items()) if f"{side}/{stage}" in r}
            means.append(list(figures.values()))
            mean = f", mean {statistics.mean(figures.values()):.1f}%" if figures else ""
            each = " ".join(f"s{seed} {v:.1f}%" for seed, v in figures.items()) or "-"
            cells.append(f"{side} {each}{mean}")
        if min(map(len, means)) > 1:
            cells.append(f"{welch(*means):+.2f} standard errors of the difference (Welch)")
        lines.append(f"{stage}: " + "; ".join(cells))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["lockstep", "seeds", "chain"])
    p.add_argument("out", type=Path, help="a trl_recipe.py --out folder whose handformer SFT is done")
    p.add_argument("--preset", default="mid-reasoning",
                   help="the preset the comparison ran (its held-out sums)")
    p.add_argument("--steps", type=int, default=120, help="lockstep: steps on each side")
    p.add_argument("--side", choices=["handformer", "trl", "stream"], default="handformer")
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--long-n", type=int, default=1000, help="held-out long sums to score each run on")
    args = p.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch.set_num_threads(1)
    work = args.out / "sft-seeds"
    if args.mode == "lockstep":
        return lockstep(args.out, args.steps, work / "lockstep")
    cfg = pipeline.config_for(args.preset, {"threads": 1})
    held = ReasoningSet(cfg.seed, pipeline.difficulty(cfg)).sample(args.long_n, cfg.eval_split, "eval",
                                                                   kinds=(LONG_KIND,))
    if args.mode == "chain":
        for seed in args.seeds:
            chain(args.out, seed, cfg, held)
        return print(chain_table(args.out))
    for seed in args.seeds:
        run_dir = work / f"{args.side}-s{seed}"
        seconds = train_seed(args.out, args.side, seed, run_dir)
        greedy = evaluate_reasoning(run_dir, held, 1, 1.0, cfg.grpo_max_new_tokens, cfg.seed)["greedy"]
        low, high = greedy["interval_95"]
        print(f"{args.side} seed {seed}: {100 * greedy['value']:.1f}% [{100 * low:.1f}, {100 * high:.1f}] of "
              f"{greedy['n']} long sums; trained in {seconds:.0f} s")


if __name__ == "__main__":
    main()
