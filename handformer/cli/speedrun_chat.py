"""`handformer speedrun chat`: zero to a chat model on a CPU (tasks/speedrun_chat/pipeline.py):
pretraining, SFT, DPO and GRPO, with the held-out accuracy after each stage in a table and a plot."""

from __future__ import annotations

import argparse
from pathlib import Path

from handformer.cli.common import parse_overrides


def cmd_speedrun_chat(args: argparse.Namespace) -> int:
    from handformer.io import atomic_write_text
    from handformer.see.plots import plot_stage_accuracy
    from handformer.tasks.speedrun_chat.pipeline import config_for, run_speedrun
    from handformer.tasks.speedrun_chat.report import accuracy_table

    cfg = config_for(args.preset, parse_overrides(args.set))
    out = Path(args.out)
    report = run_speedrun(cfg, out, base=args.base)
    table = accuracy_table(report)
    atomic_write_text(out / "accuracy.md", table + "\n")
    plot = plot_stage_accuracy(report, out / "accuracy.png")
    print(f"\n{table}\n\nplot: {plot}\nreport: {out / 'report.json'}")
    print(f"chat with it: handformer chat {out / 'grpo'}    serve it: handformer serve {out / 'grpo'}")
    return 0


def add_target(targets: argparse._SubParsersAction) -> None:
    p = targets.add_parser("chat", help="pretrain, SFT, DPO and GRPO a small assistant on this machine")
    p.add_argument("--out", default="runs/speedrun-chat", help="folder of the stages' runs (default "
                   "runs/speedrun-chat); run again to resume")
    p.add_argument("--preset", default="reasoning",
                   choices=["reasoning", "mid-reasoning", "smoke-reasoning", "reasoning-80",
                            "mid-reasoning-80", "facts", "smoke"],
                   help="reasoning (the default: the reasoning tasks, where GRPO teaches the long sums "
                   "past SFT's plateau, scored on the report split, about 34 minutes of CPU at "
                   "threads=1), mid-reasoning (its post-training from its base, --base OUT/base of a "
                   "reasoning run, on half the mix for half the SFT steps, scored on the search split: "
                   "for a recipe search, about 10 minutes of CPU), smoke-reasoning (seconds, "
                   "for tests), reasoning-80 and mid-reasoning-80 (the recipe with 80 worked long "
                   "sums, kept only to repeat the experiments of docs/benchmarks.md that ran it), "
                   "facts (the fact tasks, under an hour) or smoke (facts in seconds)")
    p.add_argument("--base", metavar="RUN_DIR", help="start from this run (e.g. an imported stories260K) "
                   "instead of pretraining one: the role tokens are added, its embeddings grown")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a setting, e.g. --set sft_steps=300 (SpeedrunChatConfig's fields)")
    p.set_defaults(func=cmd_speedrun_chat)
