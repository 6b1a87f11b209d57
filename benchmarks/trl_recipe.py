"""Benchmark: the reasoning recipe of `handformer speedrun chat` through TRL's SFTTrainer, DPOTrainer
and GRPOTrainer, beside handformer's own SFT, DPO and GRPO stages, and both scored the same way.

    same base      handformer's base run (pretrained here, or --base), exported with `export_hf` for TRL
    same data      the files handformer's stages learn from (OUT/handformer/data/STAGE.jsonl): the SFT
                   conversations, the DPO pairs (rejected replies from handformer's SFT model, so the
                   two DPO stages see the same pairs) and the GRPO questions with their answer keys
    same settings  read from each handformer run's config.json: steps, learning rate, warmup, cosine
                   down to min_lr, AdamW betas and weight decay, clipping, batch size, block size, the
                   validation share whose best weights are kept (TRL: load_best_model_at_end), packing
                   (TRL: bfd), DPO's beta with the reference cached (precompute_ref_log_probs) and the chosen
                   replies' log-likelihood weight (sft_weight: TRL's "sft" loss), GRPO's
                   group size, reply length, temperature, loss_type, scale_rewards, beta and epsilon
    same reward    reasoning.reasoning_reward, which already has TRL's reward-function form
    same scorer    each TRL model is imported back (import_hf) and asked the same held-out questions by
                   scoring.evaluate_reasoning: greedy accuracy and pass@k with standard errors

Each stage chains on its own side: TRL's DPO starts from TRL's SFT model, its GRPO from its DPO model.
The wall time of a stage is its training alone (handformer: the post-training job, from its data file
to its saved run; TRL: the trainer built from the same file, trained and saved), at the same torch
threads. Steps are done in order (base, handformer sft, TRL sft, handformer dpo, ...) and recorded in
OUT/results.json as each ends. A handformer step that was cut off is done again; a TRL step resumes
from its last checkpoint (saved where handformer evaluates), its time the sum of its parts up to
there. So `--next` (one step, then exit) lets a long comparison run as several short jobs.

    python benchmarks/trl_recipe.py --preset smoke-reasoning --out runs/trl-recipe-smoke
    python benchmarks/trl_recipe.py --preset mid-reasoning --base runs/reasoning/base --set threads=1 \\
        --out runs/trl-recipe-mid --next

Needs `trl` (a dev dependency of handformer, pinned). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.cli.common import parse_overrides  # noqa: E402
from handformer.generation.chat import stop_ids_for  # noqa: E402
from handformer.generation.chat_template import TEMPLATE_FILE, load_chat_template  # noqa: E402
from handformer.inference.threads import intra_op_threads  # noqa: E402
from handformer.io import atomic_write_text  # noqa: E402
from handformer.tasks.lm.exports import export_hf  # noqa: E402
from handformer.tasks.lm.imports import import_hf  # noqa: E402
from handformer.tasks.lm.run import load_lm  # noqa: E402
from handformer.tasks.speedrun_chat import pipeline, reasoning_stages  # noqa: E402
from handformer.tasks.speedrun_chat.reasoning import LONG_KIND, ReasoningSet, reasoning_reward  # noqa: E402
from handformer.tasks.speedrun_chat.scoring import evaluate_reasoning  # noqa: E402

POST = ("sft", "dpo", "grpo")
STEPS = ("base",) + tuple(f"{side}/{stage}" for stage in POST for side in ("handformer", "trl"))


# --- handformer's side --------------------------------------------------------------------------

def handformer_step(stage: str, cfg, problems: ReasoningSet, out: Path, log) -> float:
    """Train handformer's stage from its previous stage on freshly written data; its seconds."""
    side = out / "handformer"
    previous = side / ("base" if stage == "sft" else POST[POST.index(stage) - 1])
    with intra_op_threads(cfg.threads or None):
        records, _ = pipeline.stage_records(stage, cfg, problems, previous)
    path = pipeline.write_jsonl(side / "data" / f"{stage}.jsonl", records)
    shutil.rmtree(side / stage, ignore_errors=True)  # a run that was cut off starts again
    start = time.perf_counter()
    with intra_op_threads(cfg.threads or None):
        pipeline.train_post_stage(stage, cfg, previous, side, path, log)
    return time.perf_counter() - start


def base_step(cfg, problems: ReasoningSet, out: Path, base: str | None, log) -> float:
    """The base both sides start from: `base` copied, or pretrained here; its seconds (0 when copied)."""
    side = out / "handformer"
    shutil.rmtree(side / "base", ignore_errors=True)
    if base is not None:
        shutil.copytree(base, side / "base", ignore=shutil.ignore_patterns("checkpoint.safetensors"))
        return 0.0
    start = time.perf_counter()
    with intra_op_threads(cfg.threads or None):
        pipeline.train_base(cfg, problems, side, log)
    return time.perf_counter() - start


# --- TRL's side ---------------------------------------------------------------------------------

def split(records: list[dict], fraction: float) -> tuple[list[dict], list[dict]]:
    """(training, validation) as handformer's split_lines cuts a file: the last `fraction` of it."""
    n_val = int(len(records) * fraction)
    if fraction and not n_val:
        n_val = 1 if len(records) > 1 else 0
    return (records[:len(records) - n_val], records[len(records) - n_val:]) if n_val else (records, [])


def trl_arguments(config: dict[str, Any], folder: Path, has_val: bool) -> dict[str, Any]:
    """TrainingArguments of a handformer run's config.json: its schedule, optimizer and batch."""
    train, data = config["train"], config["data"]
    args = {"output_dir": str(folder), "max_steps": train["steps"], "learning_rate": train["lr"],
            "warmup_steps": train["warmup"], "lr_scheduler_type": "cosine_with_min_lr",
            "lr_scheduler_kwargs": {"min_lr": train["min_lr"]}, "adam_beta1": train["beta1"],
            "adam_beta2": train["beta2"], "weight_decay": train["weight_decay"],
            "max_grad_norm": train["clip_grad"], "seed": train["seed"], "data_seed": train["seed"],
            "per_device_train_batch_size": data["batch_size"],
            "per_device_eval_batch_size": data["batch_size"],
            "report_to": "none", "use_cpu": True, "bf16": False, "gradient_checkpointing": False,
            "logging_steps": train["log_every"], "disable_tqdm": True,
            # checkpoints (with the optimizer) where handformer evaluates: a run cut off resumes there
            "save_strategy": "steps", "save_steps": train["eval_every"], "save_total_limit": 1}
    if has_val:  # handformer keeps the weights of the best validation loss, evaluated every eval_every steps
        args.update({"eval_strategy": "steps", "eval_steps": train["eval_every"],
                     "load_best_model_at_end": True, "metric_for_best_model": "eval_loss",
                     "greater_is_better": False})
    return args


def as_messages(stage: str, record: dict) -> dict:
    """A handformer data line in TRL's conversational form."""
    if stage == "sft":
        return record
    user = [{"role": "user", "content": record["prompt"]}]
    if stage == "dpo":
        return {"prompt": user, "chosen": [{"role": "assistant", "content": record["chosen"]}],
                "rejected": [{"role": "assistant", "content": record["rejected"]}]}
    return {**record, "prompt": user}


def trainer_for(stage: str, config: dict[str, Any], hf_dir: Path, folder: Path, records: list[dict]):
    """TRL's trainer of `stage` on the export in `hf_dir`, set as handformer's run `config` was."""
    import datasets
    import transformers
    import trl

    data = config["data"]
    train, val = split([as_messages(stage, r) for r in records], data["val_fraction"])
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).float()
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    run = load_lm(config["init_from_dir"])
    model.generation_config.eos_token_id = stop_ids_for(run.tokenizer, run.tokens.eos_ids,
                                                        load_chat_template(config["init_from_dir"]))
    args = trl_arguments(config, folder, bool(val))
    sets = {"train_dataset": datasets.Dataset.from_list(train), "processing_class": tokenizer,
            "eval_dataset": datasets.Dataset.from_list(val) if val else None}
    if stage == "sft":
        args = trl.SFTConfig(**args, assistant_only_loss=True, packing=data["packing"],
                             packing_strategy="bfd", max_length=data["block_size"])
        return trl.SFTTrainer(model=model, args=args, **sets)
    settings = config["post_training"]["settings"]
    if stage == "dpo":
        weight = settings.get("sft_weight", 0.0)  # the chosen replies' log-likelihood: TRL's "sft" loss
        losses = {"loss_type": [settings["loss_type"], "sft"], "loss_weights": [1.0, weight]} if weight \
            else {"loss_type": [settings["loss_type"]]}
        args = trl.DPOConfig(**args, beta=settings["beta"], **losses,
                             max_length=data["block_size"] + 1,
                             precompute_ref_log_probs=settings["reference"] == "cached")
        return trl.DPOTrainer(model=model, args=args, **sets)
    args["per_device_train_batch_size"] *= settings["group_size"]  # TRL counts completions
    args = trl.GRPOConfig(**args, num_generations=settings["group_size"],
                          max_completion_length=settings["max_new_tokens"],
                          temperature=settings["temperature"],
                          top_k=settings["top_k"], top_p=settings["top_p"], loss_type=settings["loss_type"],
                          scale_rewards=settings["scale_rewards"], beta=settings["beta"],
                          epsilon=settings["epsilon"], epsilon_high=settings["epsilon_high"] or None,
                          num_iterations=settings["iterations"], shuffle_dataset=True)
    return trl.GRPOTrainer(model=model, reward_funcs=reasoning_reward, args=args, **sets)


CLOCK = "clock.json"  # in a TRL stage's work folder: the training seconds up to its last checkpoint


def clock(work: Path, start: float, before: float):
    """A callback that writes the seconds trained so far (`before` this call's `start`) at each
    checkpoint, so a resumed stage's time is the sum of its parts up to where it resumed."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            seconds = before + time.perf_counter() - start
            atomic_write_text(work / CLOCK, json.dumps({"step": state.global_step, "seconds": seconds}))

    return Clock()


def resume_point(work: Path) -> tuple[float, bool]:
    """(seconds trained, whether to resume) from a stage's work folder: its last checkpoint, when
    the clock names it."""
    path = work / CLOCK
    if not path.is_file():
        return 0.0, False
    saved = json.loads(path.read_text())
    if not (work / f"checkpoint-{saved['step']}").is_dir():
        return 0.0, False
    return saved["seconds"], True


def trl_step(stage: str, cfg, out: Path, log) -> float:
    """Train TRL's stage from TRL's previous stage (the base's export for SFT) on handformer's data
    file of the stage, save it and import it back as a handformer run; its training seconds."""
    side, mine = out / "trl", out / "handformer"
    previous = side / (f"{POST[POST.index(stage) - 1]}_hf" if stage != "sft" else "base_hf")
    if stage == "sft" and not (previous / "config.json").is_file():
        export_hf(mine / "base", previous)
    config = json.loads((mine / stage / "config.json").read_text())
    config["init_from_dir"] = str(mine / "base")  # the tokenizer, tokens and template both sides share
    records = [json.loads(line) for line in (mine / "data" / f"{stage}.jsonl").read_text().splitlines()]
    work = side / f"{stage}_work"
    before, resume = resume_point(work)
    for name in (f"{stage}_hf", stage) + (() if resume else (f"{stage}_work",)):
        shutil.rmtree(side / name, ignore_errors=True)
    import datasets  # noqa: F401  (TRL's imports take seconds: done before the clock starts)
    import transformers  # noqa: F401
    import trl  # noqa: F401

    start = time.perf_counter()
    with intra_op_threads(cfg.threads or None):
        trainer = trainer_for(stage, config, previous, work, records)
        trainer.add_callback(clock(work, start, before))
        trainer.train(resume_from_checkpoint=resume or None)
        trainer.save_model(str(side / f"{stage}_hf"))
    seconds = before + time.perf_counter() - start
    shutil.rmtree(side / f"{stage}_work", ignore_errors=True)  # its checkpoints
    import_hf(side / f"{stage}_hf", side / stage)
    shutil.copyfile(mine / "base" / TEMPLATE_FILE, side / stage / TEMPLATE_FILE)
    log(f"[trl/{stage}] trained in {seconds:.0f} s")
    return seconds


# --- scoring and the table ----------------------------------------------------------------------

def figures(cfg, step: str, out: Path, held: list) -> dict[str, Any]:
    """The step's model on the held-out questions, scored by the speedrun's scorer."""
    with intra_op_threads(cfg.threads or None):
        if step == "base":
            return reasoning_stages.stage_result("base", out / "handformer" / "base", held, 0,
                                                 cfg.grpo_max_new_tokens, cfg.seed)["reasoning"]
        return evaluate_reasoning(out / step, held, cfg.eval_samples, 1.0, cfg.grpo_max_new_tokens, cfg.seed)


def standard_error(share: dict[str, Any]) -> float:
    p, n = share["value"], share["n"]
    return math.sqrt(p * (1 - p) / n) if n else 0.0


def cell(share: dict[str, Any] | None) -> str:
    if share is None:
        return "-"
    return f"{100 * share['value']:.1f} ± {100 * standard_error(share):.1f}"


def table(results: dict[str, Any], k: int) -> str:
    """The comparison as markdown: greedy accuracy first (± its standard error), on the long sums
    when they were scored, pass@k, form, wall time, and per stage the difference in standard errors
    of the difference and TRL's time over handformer's."""
    long = any("long_sums" in r for r in results.values())
    head = ["long sums greedy %", f"long sums pass@{k} %"] if long else []
    lines = ["| stage | trainer | " + " | ".join(head + ["greedy %", f"pass@{k} %", "ended and parsed %",
                                                       "train s"]) + " |",
             "|---|---|" + "---:|" * (len(head) + 4)]
    for step, r in results.items():
        stage, _, side = step.partition("/")[::-1] if "/" in step else ("base", "", "")
        f, sums = r["figures"], r.get("long_sums", {})
        cells = [cell(sums.get("greedy")), cell(sums.get(f"pass@{k}"))] if long else []
        cells += [cell(f["greedy"]), cell(f.get(f"pass@{k}")), f"{100 * f['ended_and_parsed']['value']:.1f}",
                  f"{r['train_s']:.0f}"]
        lines.append(f"| {stage} | {side or '-'} | " + " | ".join(cells) + " |")
    notes = [note for stage in POST for note in stage_notes(stage, results)]
    return "\n".join(lines + [""] + notes)


def stage_notes(stage: str, results: dict[str, Any]) -> list[str]:
    """handformer against TRL at one stage: each set's greedy difference in points and in standard
    errors of the difference, and TRL's time over handformer's."""
    ours, theirs = results.get(f"handformer/{stage}"), results.get(f"trl/{stage}")
    if not (ours and theirs):
        return []
    gaps = []
    for name, key in (("long sums", "long_sums"), ("mix", "figures")):
        if key in ours and key in theirs:
            a, b = ours[key]["greedy"], theirs[key]["greedy"]
            se = math.hypot(standard_error(a), standard_error(b))
            gap = (a["value"] - b["value"]) / se if se else 0.0
            gaps.append(f"{name} {100 * (a['value'] - b['value']):+.1f} points ({gap:+.2f} standard errors "
                        f"of the difference)")
    return [f"{stage}: handformer - TRL: {'; '.join(gaps)}; TRL's wall time "
            f"{theirs['train_s'] / max(ours['train_s'], 1e-9):.2f}x handformer's"]


def train_step(step: str, cfg, problems: ReasoningSet, out: Path, base: str | None) -> float:
    """Train one step of STEPS; its seconds."""
    side, _, stage = step.partition("/")
    if step == "base":
        return base_step(cfg, problems, out, base, print)
    if side == "handformer":
        return handformer_step(stage, cfg, problems, out, print)
    return trl_step(stage, cfg, out, print)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="smoke-reasoning",
                   choices=[k for k in pipeline.PRESETS if "reasoning" in k])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a SpeedrunChatConfig field")
    p.add_argument("--base", help="start both sides from this speedrun base run instead of pretraining one")
    p.add_argument("--out", default="runs/trl-recipe", help="folder of both sides' runs and results.json")
    p.add_argument("--next", action="store_true", help="do the next unfinished step only, then exit")
    args = p.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        cfg = pipeline.config_for(args.preset, parse_overrides(args.set))
    except ValueError as err:  # a --set without =, an unknown field, a bad value: one line
        p.error(str(err))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    problems = ReasoningSet(cfg.seed, pipeline.difficulty(cfg))
    held = pipeline.held_out_questions(cfg, problems)
    held_long = problems.sample(cfg.eval_long_sums, cfg.eval_split, "eval", kinds=(LONG_KIND,))
    for step in STEPS:
        if "figures" in results.get(step, {}):
            continue
        if step not in results:  # trained, then scored: a run cut off while scoring only scores again
            results[step] = {"train_s": round(train_step(step, cfg, problems, out, args.base), 1)}
            atomic_write_text(path, json.dumps(results, indent=2) + "\n")
        if held_long:  # GRPO's target, scored apart as the speedrun scores it
            results[step]["long_sums"] = figures(cfg, step, out, held_long)
        results[step]["figures"] = figures(cfg, step, out, held)
        atomic_write_text(path, json.dumps(results, indent=2) + "\n")
        print(f"[{step}] done in {results[step]['train_s']:.0f} s of training")
        if args.next:
            break
    import transformers
    import trl

    print(f"{args.preset}, {len(held)} held-out questions, threads {torch.get_num_threads()}; torch "
          f"{torch.__version__}, trl {trl.__version__}, transformers {transformers.__version__}")
    print(table(results, cfg.eval_samples))


if __name__ == "__main__":
    main()
