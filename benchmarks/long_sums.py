"""Benchmark: GRPO's target, the long sums (docs/benchmarks.md, "GRPO's target: long sums").

SFT on the `mid-reasoning` preset's 3,000 conversations of the mix plus N worked long sums (sums of
up to 4 digits, at least one number of 4), then GRPO on questions alone (a share of them long sums,
the rest the mix), each scored on 100 held-out long sums of the `search` split and on the 240
questions of the mix (greedy, pass@8 and the mean of 8 samples at temperature 1.0). The stages are
`speedrun chat`'s own (`pipeline.train_post_stage`, `scoring.replies` and `scoring.score`), at one
thread, from the base of a `reasoning` run:

    handformer speedrun chat --preset reasoning-80 --out runs/reasoning --set threads=1   # its base
    python benchmarks/long_sums.py sft runs/reasoning/base runs/long/s30 --long-sums 30
    python benchmarks/long_sums.py sft runs/reasoning/base runs/long/s30lr3 --long-sums 30 --lr 3e-3
    python benchmarks/long_sums.py sft runs/reasoning/base runs/long/s30long --long-sums 30 --steps 1200
    python benchmarks/long_sums.py grpo runs/long/s30/sft runs/long/g30
    python benchmarks/long_sums.py score runs/long/s30/sft runs/long/g30/grpo --sets long mix
    python benchmarks/long_sums.py score runs/reasoning-mix/sft --sets unseen-long unseen-days

The same sweep on the `reasoning-80` preset's own SFT data (8,000 conversations and 80 long sums, as the
preset draws them; `--long-repeats` shows each long sum several times), the best chosen greedily on
the preset's sets of the `search` split (1,000 long sums, 1,002 of the mix), then scored once on its
`report` split; GRPO on the questions the preset's GRPO draws:

    python benchmarks/long_sums.py sft runs/reasoning/base runs/sweep/lr3e-3 --preset-draw \
        --conversations 8000 --long-sums 80 --lr 3e-3
    python benchmarks/long_sums.py grpo runs/sweep/lr3e-3/sft runs/sweep/g3 --preset-draw
    python benchmarks/long_sums.py report --split search runs/sweep/lr3e-3/sft runs/reasoning/sft
    python benchmarks/long_sums.py report runs/sweep/lr3e-3/sft runs/reasoning/sft runs/reasoning/grpo

Worked steps for short sums only ("RL past SFT's plateau" in docs/benchmarks.md): `--long-sums 0` with
`--scratchpad running` (steps that read only the line above), `--long-direct N` (long sums answered
without steps) or `--long-easy N` (worked sums of a 4-digit and a 2-digit number; `report --both-long`
asks sums of two 4-digit numbers); `report --samples 8 --long-n 200` adds pass@8.

Each command prints its seconds of training and its figures (`SCORE RUN SET: greedy ...`,
`SEARCH RUN SET: greedy ...`, `REPORT RUN SET: greedy ...`).
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

import torch

from handformer.tasks.speedrun_chat import reasoning as R
from handformer.tasks.speedrun_chat import reasoning_stages as RS
from handformer.tasks.speedrun_chat.pipeline import config_for, difficulty, train_post_stage, write_jsonl
from handformer.tasks.speedrun_chat.scoring import replies, score

LONG = R.Difficulty(4, 4, 60)  # sums of 2 to 4 digits; kept when one number has 4
HELD_LONG, HELD_MIX = 100, 240


def long_sums(n: int, split: str, stream: str) -> list[R.Task]:
    """`n` distinct sums with a number of 4 digits, from `split` ("train", or any held-out one)."""
    rng, out, seen = random.Random(f"exp:addition:{split}:{stream}"), [], set()
    for _ in range(200_000 + 50 * n):
        if len(out) == n:
            return out
        t = R.DRAW["addition"](rng, LONG)
        if t.key in seen or not _is_long(t):
            continue
        if (R.split_of("addition", t.key, 0) == "train") == (split == "train"):
            seen.add(t.key)
            out.append(t)
    raise SystemExit(f"only {len(out)} long sums in the {split} split; ask for fewer")


def unseen(kind: str, level: R.Difficulty, keep: Callable[[R.Task], bool], n: int = 60) -> list[R.Task]:
    """`n` distinct questions of a size SFT never saw, from outside the train split."""
    rng, out, seen = random.Random(f"probe:{kind}:7"), [], set()
    while len(out) < n:
        t = R.DRAW[kind](rng, level)
        if t.key not in seen and keep(t) and R.split_of(kind, t.key, 0) != "train":
            seen.add(t.key)
            out.append(t)
    return out


def _is_long(t: R.Task) -> bool:
    return max(map(int, t.key.split("+"))) >= 1000


def _over_60_days(t: R.Task) -> bool:
    return int(t.key.split("+")[1]) > 60


def _chat(task: R.Task, think: bool) -> dict:
    return {"messages": [{"role": "user", "content": task.question},
                         {"role": "assistant", "content": task.reply(think)}]}


def running_steps(a: int, b: int) -> list[str]:
    """A sum's steps where each line stands on the line above alone: the last digits and the carry,
    their sum, the answer so far and the numbers left ("9+8=17: 7, left 266+187")."""
    steps, carry, done = [], 0, ""
    while a or b or carry:
        if not (a or b):
            steps.append(f"carry {carry}: {carry}{done}")
            break
        terms = f"{a % 10}+{b % 10}" + (f"+{carry}" if carry else "")
        total = a % 10 + b % 10 + carry
        carry, done, a, b = total // 10, f"{total % 10}{done}", a // 10, b // 10
        steps.append(f"{terms}={total}: {done}" + (f", left {a}+{b}" if a or b else ""))
    return steps


def _running(record: dict) -> dict:
    """A worked sum of an SFT record rewritten with `running_steps` (other records unchanged)."""
    user, reply = record["messages"][-2]["content"], record["messages"][-1]["content"]
    numbers = re.findall(r"\d+", user)
    if not reply.startswith(R.THINK_OPEN) or "days" in user or len(numbers) != 2 or "Make" in user \
            or "reach" in user:
        return record
    a, b = map(int, numbers)
    steps = "\n".join([*running_steps(a, b), f"so {a + b}"])
    answer = {"role": "assistant", "content": f"{R.THINK_OPEN}\n{steps}\n{R.THINK_CLOSE}\n{a + b}"}
    return {"messages": [*record["messages"][:-1], answer]}


def long_and_short(n: int) -> list[R.Task]:
    """`n` worked sums of a 4-digit number and a 2-digit one (either order), from the train split:
    four columns, but never two 4-digit numbers."""
    rng, out, seen = random.Random("easy-long"), [], set()
    while len(out) < n:
        x, y = rng.randint(1000, 9999), rng.randint(10, 99)
        x, y = (x, y) if rng.random() < 0.5 else (y, x)
        key = f"{x}+{y}"
        if key in seen or R.split_of(R.LONG_KIND, key, 0) != "train":
            continue
        seen.add(key)
        question = rng.choice([f"What is {x} + {y}?", f"Compute {x} + {y}.", f"Add {x} and {y}."])
        steps = [*R.addition_steps(x, y), f"so {x} + {y} = {x + y}"]
        out.append(R.Task(R.LONG_KIND, question, str(x + y), "\n".join(steps), key))
    return out


def _both_long(task: R.Task) -> bool:
    return min(map(int, task.key.split("+"))) >= 1000


def sft(args: argparse.Namespace, log: Callable[[str], None]) -> None:
    cfg = config_for("mid-reasoning", {"threads": 1, "sft_steps": args.steps, "sft_lr": args.lr})
    if args.preset_draw:  # the `reasoning` preset's own data: its draw of the conversations and long sums
        records = RS.sft_records(args.conversations, R.ReasoningSet(0, difficulty(cfg)), 0, args.long_sums,
                                 args.long_repeats)
        if args.scratchpad == "running" or args.long_easy or args.long_direct:
            records = [_running(r) for r in records] if args.scratchpad == "running" else records
            records += [_chat(t, True) for t in long_and_short(args.long_easy)]
            records += [_chat(t, False) for t in R.ReasoningSet(0, difficulty(cfg)).sample(
                args.long_direct, "train", "sft-direct", kinds=(R.LONG_KIND,))] if args.long_direct else []
            random.Random("0:sft-long").shuffle(records)
    else:
        records = RS.sft_records(args.conversations, R.ReasoningSet(0, difficulty(cfg)))
        records += [{"messages": [{"role": "user", "content": t.question},
                                  {"role": "assistant", "content": t.reply(True)}]}
                    for t in long_sums(args.long_sums, "train", "sft")]
        random.Random(1).shuffle(records)
    train_post_stage("sft", cfg, args.previous, args.out, write_jsonl(args.out / "sft.jsonl", records), log)


def grpo(args: argparse.Namespace, log: Callable[[str], None]) -> None:
    cfg = config_for("mid-reasoning", {"threads": 1, "grpo_steps": args.steps, "grpo_lr": args.lr,
                                       "grpo_group": args.group, "grpo_batch": args.batch,
                                       "grpo_beta": args.beta, "grpo_max_new_tokens": args.max_new_tokens,
                                       "seed": args.seed})
    n = args.steps * args.batch
    if args.preset_draw:  # the `reasoning` preset's own questions, as its GRPO stage draws them
        records = RS.grpo_prompts(n, R.ReasoningSet(0, difficulty(cfg)), cfg.grpo_countdown_share,
                                  cfg.grpo_countdown_numbers, args.long_share)
        if args.both_long:  # its long sums replaced by sums of two 4-digit numbers
            drawn = R.ReasoningSet(0, difficulty(cfg)).sample(2 * n, "train", "grpo4", kinds=(R.LONG_KIND,))
            both = iter([t for t in drawn if _both_long(t)])
            records = [r if r["kind"] != R.LONG_KIND else {"prompt": (t := next(both)).question,
                                                            "kind": t.kind, "key": t.key} for r in records]
    else:
        n_long = round(n * args.long_share)
        mix = R.ReasoningSet(0, difficulty(cfg)).sample(n - n_long, "train", "grpo")
        tasks = long_sums(n_long, "train", "grpo") + mix
        random.Random(2).shuffle(tasks)
        records = [{"prompt": t.question, "kind": t.kind, "key": t.key} for t in tasks]
    train_post_stage("grpo", cfg, args.previous, args.out, write_jsonl(args.out / "grpo.jsonl", records), log)


def score_runs(args: argparse.Namespace, log: Callable[[str], None]) -> None:
    level = difficulty(config_for("mid-reasoning", {}))
    sets = {"long": lambda: long_sums(HELD_LONG, "search", "eval"),
            "mix": lambda: R.ReasoningSet(0, level).sample(HELD_MIX, "search", "eval"),
            # sizes the mix's SFT never saw: sums with a number of 4 digits, dates 61 to 90 days on
            "unseen-long": lambda: unseen("addition", LONG, _is_long),
            "unseen-days": lambda: unseen("days", R.Difficulty(3, 4, 90), _over_60_days)}
    for run in args.runs:
        for name in args.sets:
            tasks = sets[name]()
            start = time.time()
            greedy, sampled = replies(run, tasks, 8, 1.0, 104, 0)
            r = score(tasks, greedy, sampled)
            log(f"SCORE {run} {name}: greedy {r['greedy']['value']:.3f} pass@8 {r['pass@8']['value']:.3f} "
                f"mean {r['sampled']['value']:.3f} n={len(tasks)} {time.time() - start:.0f}s")
            if name == "mix":
                log(f"   per kind {({k: round(v['greedy']['value'], 3) for k, v in r['per_kind'].items()})}")


def report_runs(args: argparse.Namespace, log: Callable[[str], None]) -> None:
    """Greedy figures on the `reasoning` preset's held-out sets of `--split`: 1,000 long sums and 1,002
    questions of the mix (of the `report` split: the sets of the "Zero to chat" table)."""
    cfg = config_for("reasoning", {})
    tasks = R.ReasoningSet(cfg.seed, difficulty(cfg))
    long = tasks.sample(args.long_n or cfg.eval_long_sums, args.split, "eval", kinds=(R.LONG_KIND,))
    if args.both_long:  # the first long_n of the sums of two 4-digit numbers
        both = tasks.sample(4 * len(long), args.split, "eval", kinds=(R.LONG_KIND,))
        long = [t for t in both if _both_long(t)][:len(long)]
    sets = {"long": long, "mix": tasks.sample(cfg.eval_per_kind * len(R.REASONING_KINDS), args.split, "eval")}
    for run in args.runs:
        for name in args.sets.split(","):
            held, start = sets[name], time.time()
            greedy, sampled = replies(run, held, args.samples, 1.0, cfg.grpo_max_new_tokens, cfg.seed)
            r = score(held, greedy, sampled)
            g, k = r["greedy"], f"pass@{args.samples}"
            low, high = g["interval_95"]
            more = f" {k} {r[k]['value']:.3f} mean {r['sampled']['value']:.3f}" if args.samples else ""
            log(f"{args.split.upper()} {run} {name}: greedy {g['value']:.3f} ({g['right']}/{g['n']}, "
                f"95% {low:.3f} to {high:.3f}){more} {time.time() - start:.0f}s")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sft", help="SFT from a base run on the mix plus --long-sums worked long sums")
    s.add_argument("previous", type=Path, help="the base run (OUT/base of a `reasoning` run)")
    s.add_argument("out", type=Path)
    s.add_argument("--long-sums", type=int, default=30)
    s.add_argument("--conversations", type=int, default=3000, help="conversations of the mix")
    s.add_argument("--preset-draw", action="store_true",
                   help="draw the data as the presets do (the default `reasoning` preset's SFT: "
                        "--conversations 8000 --long-sums 30 --long-repeats 3)")
    s.add_argument("--long-repeats", type=int, default=1,
                   help="with --preset-draw: each long sum this many times")
    s.add_argument("--long-direct", type=int, default=0,
                   help="with --preset-draw: this many more long sums answered directly, without the steps")
    s.add_argument("--long-easy", type=int, default=0,
                   help="with --preset-draw: this many worked sums of a 4-digit and a 2-digit number")
    s.add_argument("--scratchpad", choices=["columns", "running"], default="columns",
                   help="with --preset-draw: running rewrites every worked sum with running_steps")
    s.add_argument("--steps", type=int, default=600)
    s.add_argument("--lr", type=float, default=1e-3)
    g = sub.add_parser("grpo", help="GRPO from an SFT run, --long-share of its questions long sums")
    g.add_argument("previous", type=Path, help="the SFT run (OUT/sft of the sft command)")
    g.add_argument("out", type=Path)
    g.add_argument("--steps", type=int, default=100)
    g.add_argument("--lr", type=float, default=1e-4)
    g.add_argument("--group", type=int, default=8)
    g.add_argument("--batch", type=int, default=8)
    g.add_argument("--long-share", type=float, default=0.6)
    g.add_argument("--preset-draw", action="store_true",
                   help="draw the questions as the `reasoning` preset's GRPO does")
    g.add_argument("--beta", type=float, default=0.0, help="the KL term's weight (0: none)")
    g.add_argument("--seed", type=int, default=0,
                   help="the seed of the samples and of the batches' order (the questions stay seed 0's)")
    g.add_argument("--max-new-tokens", type=int, default=104)
    g.add_argument("--both-long", action="store_true",
                   help="with --preset-draw: the long sums are sums of two 4-digit numbers")
    c = sub.add_parser("score", help="score runs on the held-out long sums and the mix")
    c.add_argument("runs", nargs="+")
    c.add_argument("--sets", nargs="+", default=["long"],
                   choices=["long", "mix", "unseen-long", "unseen-days"])
    r = sub.add_parser("report", help="greedy figures on the `reasoning` preset's held-out sets")
    r.add_argument("runs", nargs="+")
    r.add_argument("--split", choices=["search", "report"], default="report",
                   help="search: the recipe search's questions; report: the reported figures' (drawn once, "
                        "at the end)")
    r.add_argument("--sets", default="long,mix", help="long, mix or long,mix")
    r.add_argument("--samples", type=int, default=0, help="samples a question at temperature 1 (pass@k)")
    r.add_argument("--long-n", type=int, default=0, help="long sums asked (0: the preset's 1,000)")
    r.add_argument("--both-long", action="store_true", help="only sums of two 4-digit numbers")
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    def log(line: str) -> None:
        print(line, flush=True)

    if args.command == "score":
        return score_runs(args, log)
    if args.command == "report":
        return report_runs(args, log)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    (sft if args.command == "sft" else grpo)(args, log)
    log(f"TRAINED {args.out} {args.command} {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
