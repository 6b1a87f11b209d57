"""`handformer speedrun TARGET`: end-to-end runs that build something from nothing on the machine at
hand and measure it, one subcommand a target: the training speedruns (handformer/speedrun/, one file
each) and zero to chat (cli/speedrun_chat.py, whose `add_target` adds its parser)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from handformer.cli.common import parse_overrides
from handformer.cli.speedrun_chat import add_target as add_chat


def command(run: Callable[[argparse.Namespace], object]) -> Callable[[argparse.Namespace], int]:
    """A target's run as a command: its --set pairs parsed into `args.overrides` first."""
    def cmd(args: argparse.Namespace) -> int:
        args.overrides = parse_overrides(getattr(args, "set", None) or [])
        run(args)
        return 0

    return cmd


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from handformer.speedrun import TARGETS  # light: the targets import the heavy rooms when run

    p = sub.add_parser("speedrun", help="end-to-end runs from nothing, measured (targets: shakespeare, chat)",
                       description="A speedrun target from nothing, timed: shakespeare trains one "
                                   "record config from process start to the final checkpoint and "
                                   "scores it (docs/speedrun.md; records: benchmarks/speedrun.py); "
                                   "chat builds a small assistant (docs/post-training.md).")
    targets = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    for target in TARGETS.values():
        t = targets.add_parser(target.name, help=target.help, description=target.help)
        target.add_arguments(t)
        t.set_defaults(func=command(target.run))
    add_chat(targets)  # zero to chat: pretraining, SFT, DPO and GRPO (docs/post-training.md)
