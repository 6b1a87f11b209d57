"""Benchmark: does SFT lose what pretraining taught? `speedrun chat`'s facts tasks at small scale.

One base model is pretrained as `speedrun chat` pretrains it (the facts as plain text and the pydoc
corpus), on a smaller model and fewer steps (SMALL). Then SFT runs from it several ways (VARIANTS:
the preset's recipe scaled to the base's steps, a lower learning rate, fewer steps, the loss on
every token instead of the replies only). Every run answers the same held-out questions (80 of
each task, never in any stage's data), greedily, two ways:

- as text: the statement's beginning ("37 plus 48 is"), as the base is asked;
- as a chat: the question in the chat template (not for the base: it never saw the template).

SFT asked as text says whether the knowledge is still in the weights; SFT asked as a chat says
whether the chat reaches it. Each figure is printed with its number of questions and a 95 % Wilson
interval. Results go to OUT/results.json; a part already there is skipped, so the benchmark can run
in several calls (`--only base`, then `--only preset lr/3`, ...).

    python benchmarks/sft_forgetting.py --out runs/sft-forgetting --threads 1
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.io import atomic_write_text  # noqa: E402
from handformer.tasks.speedrun_chat import pipeline  # noqa: E402
from handformer.tasks.speedrun_chat.problems import KINDS, ProblemSet, is_correct  # noqa: E402
from handformer.tasks.speedrun_chat.scoring import text_answers, wilson_interval  # noqa: E402

# The full preset's shape, smaller: SFT keeps the full preset's ratio of steps (600 of 1,500) and
# its learning rate (a third of pretraining's).
SMALL = {"vocab_size": 1024, "d_model": 96, "n_layers": 2, "n_heads": 2, "block_size": 128,
         "pretrain_facts": 40_000, "pretrain_pydoc_chars": 150_000, "pretrain_steps": 1800,
         "pretrain_batch": 16, "sft_conversations": 5000, "sft_steps": 720, "sft_batch": 16,
         "eval_per_kind": 80, "threads": 1}
VARIANTS = {  # name: (changes to the config, changes to SFT's data section, pretraining text mixed in)
    "preset": ({}, {}, False),
    "lr/3": ({"sft_lr": 1e-3 / 3}, {}, False),
    "steps/4": ({"sft_steps": 180}, {}, False),
    "steps*2": ({"sft_steps": 1440}, {}, False),
    "steps*2, mixed": ({"sft_steps": 1440}, {}, True),
    "every token": ({}, {"train_on_prompt": True}, False),
    "mixed": ({}, {}, True),
    "statement": ({}, {}, False),  # each reply is the fact's statement ("37 plus 48 is 85.")
}
MIX_STATEMENTS = 4  # statements a pretraining document mixed into SFT (one per 2 conversations)
END = "<|im_end|>"


def figures(result: dict, n_kind: int) -> dict:
    """Right answers and n, overall and per task, from pipeline.accuracy's shares."""
    per_kind = {k: round(v * n_kind) for k, v in result["per_kind"].items()}
    return {"right": sum(per_kind.values()), "n": n_kind * len(per_kind), "per_kind": per_kind}


def text_figures(run_dir: Path, held: list, cfg) -> dict:
    """Asked as text, as the base is: a chat run's continuation is cut at its end-of-turn token too
    (SFT ends answers with it, where the text has a full stop)."""
    texts = text_answers(run_dir, [p.prefix for p in held], cfg.grpo_max_new_tokens)
    replies = [pipeline.text_reply(t.split(END)[0], p) for t, p in zip(texts, held)]
    right = [is_correct(r, p.answer) for r, p in zip(replies, held)]
    per_kind = {k: sum(r for r, p in zip(right, held) if p.kind == k) for k in KINDS}
    dates = [(p.answer, r) for r, p in zip(replies, held) if p.kind == "dates"]
    return {"right": sum(right), "n": len(held), "per_kind": per_kind, "date_parts": date_parts(dates)}


def chat_figures(run_dir: Path, held: list, cfg, statement: bool) -> dict:
    """Asked as a chat; a reply that states the fact is read as the base's text is, after the
    statement's beginning."""
    replies = pipeline.chat_answers(run_dir, [p.question for p in held], 2 * cfg.grpo_max_new_tokens)
    if statement:
        right = [r.startswith(p.prefix) and is_correct(pipeline.text_reply(r[len(p.prefix):], p), p.answer)
                 for r, p in zip(replies, held)]
    else:
        right = [is_correct(r, p.answer) for r, p in zip(replies, held)]
    per_kind = {k: sum(r for r, p in zip(right, held) if p.kind == k) for k in KINDS}
    dates = [(p.answer, r.removeprefix(p.prefix).strip().rstrip(".")) for r, p in zip(replies, held)
             if p.kind == "dates"]
    return {"right": sum(right), "n": len(held), "per_kind": per_kind, "date_parts": date_parts(dates)}


def date_parts(pairs: list[tuple[str, str]]) -> dict:
    """How many of the (answer, reply) dates have the right year, month and day, each apart."""
    parts = {"year": 0, "month": 0, "day": 0, "n": len(pairs)}
    for answer, reply in pairs:
        got = reply.split("-")
        for i, name in enumerate(("year", "month", "day")):
            parts[name] += len(got) == 3 and got[i] == answer.split("-")[i]
    return parts


def evaluate(run_dir: Path, held: list, cfg, chat: bool, statement: bool = False) -> dict:
    out = {"text": text_figures(run_dir, held, cfg)}
    if chat:
        out["chat"] = chat_figures(run_dir, held, cfg, statement)
    return out


def statement_records(cfg, problems: ProblemSet) -> list[dict]:
    """pipeline.sft_records' conversations, each reply the fact's statement instead of the answer."""
    drawn = problems.sample(cfg.sft_conversations * 2, "train", "sft")
    pool = [replace(p, answer=p.statement) for p in drawn]
    rng, out, i = random.Random(cfg.seed + 1), [], 0
    while len(out) < cfg.sft_conversations:
        turns = rng.choice([1, 1, 2, 3])
        out.append(pipeline.conversation(pool[i:i + turns], rng))
        i = (i + turns) % (len(pool) - 3)
    return out


def mixed_documents(cfg, problems: ProblemSet) -> list[dict]:
    """Pretraining text as conversations of one assistant message (the loss learns all of it):
    MIX_STATEMENTS statements of training facts each, drawn apart from SFT's questions."""
    n = cfg.sft_conversations // 2
    facts = [p.statement for p in problems.sample(n * MIX_STATEMENTS, "train", "sft-mix")]
    return [{"messages": [{"role": "assistant", "content": "\n".join(facts[i:i + MIX_STATEMENTS])}]}
            for i in range(0, len(facts), MIX_STATEMENTS)]


def run_variant(name: str, cfg, problems: ProblemSet, out: Path, held: list) -> dict:
    changes, data, mix = VARIANTS[name]
    vcfg = replace(cfg, **changes)
    folder = out / name.replace("/", "-").replace("*", "x").replace(",", "").replace(" ", "-")
    run_dir, trained = folder / "sft", folder / "sft" / "trained.json"
    if not trained.is_file():  # trained in an earlier call: only scored again
        records = (statement_records if name == "statement" else pipeline.sft_records)(cfg, problems)
        if mix:
            records += mixed_documents(cfg, problems)
            random.Random(cfg.seed).shuffle(records)
        path = pipeline.write_jsonl(folder / "sft.jsonl", records)
        start = time.perf_counter()
        section = {"path": str(path), "batch_size": vcfg.sft_batch, "val_fraction": 0.02, **data}
        pipeline.post_stage("sft", vcfg, out / "base", folder, section, {}, vcfg.sft_steps, vcfg.sft_lr,
                            lambda *a: None)
        atomic_write_text(trained, json.dumps({"train_seconds": round(time.perf_counter() - start, 1)}))
    return {**evaluate(run_dir, held, vcfg, True, name == "statement"), **json.loads(trained.read_text()),
            "sft_lr": vcfg.sft_lr, "sft_steps": vcfg.sft_steps, "mixed": mix, **data}


def pct(right: int, n: int) -> str:
    low, high = wilson_interval(right, n)
    return f"{100 * right / n:.1f}% [{100 * low:.1f}, {100 * high:.1f}] (n={n})"


def _parts(figures: dict) -> str:
    parts = figures["date_parts"]
    return f"{parts['year']} / {parts['month']} / {parts['day']} of {parts['n']}"


def table(results: dict) -> str:
    rows = ["| run | asked as text | asked as a chat | chat: " + " / ".join(KINDS) + " |",
            "|---|---|---|---|"]
    for name, r in results.items():
        chat = r.get("chat")
        kinds = " / ".join(f"{chat['per_kind'][k]}" for k in KINDS) if chat else ""
        rows.append(f"| {name} | {pct(r['text']['right'], r['text']['n'])} | "
                    f"{pct(chat['right'], chat['n']) if chat else ''} | {kinds} |")
    rows.append("")
    rows.append("held-out dates with the right year / month / day, as text and as a chat: " + "; ".join(
        f"{name} {_parts(r['text'])}" + (f", {_parts(r['chat'])}" if "chat" in r else "")
        for name, r in results.items()))
    rows.append("as text, per task (" + " / ".join(KINDS) + "): " + "; ".join(
        f"{name} {' / '.join(str(r['text']['per_kind'][k]) for k in KINDS)}" for name, r in results.items()))
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/sft-forgetting")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="parts to run: base and/or variant names")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = pipeline.SpeedrunChatConfig.from_dict({**SMALL, "threads": args.threads})
    problems = ProblemSet(cfg.seed)
    held = pipeline.held_out_questions(cfg, problems)
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    for part in ["base", *VARIANTS]:
        if part in results or (args.only is not None and part not in args.only):
            continue
        start = time.perf_counter()
        if part == "base":
            if not (out / "base" / "trained.json").is_file():  # trained in an earlier call: only scored again
                pipeline.train_base(cfg, problems, out, lambda *a: None)
                atomic_write_text(out / "base" / "trained.json", "{}\n")
            results[part] = evaluate(out / "base", held, cfg, chat=False)
        else:
            results[part] = run_variant(part, cfg, problems, out, held)
        results[part]["seconds"] = round(time.perf_counter() - start, 1)
        atomic_write_text(path, json.dumps(results, indent=2) + "\n")
        print(f"{part}: {results[part]['seconds']:.0f} s", flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
