"""`handformer speedrun TARGET`: one subcommand a target (handformer/speedrun/, one file each)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from handformer.cli.common import parse_overrides


def command(run: Callable[[argparse.Namespace], object]) -> Callable[[argparse.Namespace], int]:
    """A target's run as a command: its --set pairs parsed into `args.overrides` first."""
    def cmd(args: argparse.Namespace) -> int:
        args.overrides = parse_overrides(getattr(args, "set", None) or [])
        run(args)
        return 0

    return cmd


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from handformer.speedrun import TARGETS  # light: the targets import the heavy rooms when run

    p = sub.add_parser("speedrun", help="train to a fixed quality as fast as this machine allows",
                       description="Train one record config of a speedrun target, timed from process "
                                   "start to the final checkpoint, then score it as the target "
                                   "defines (docs/speedrun.md). Records: benchmarks/speedrun.py.")
    targets = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    for target in TARGETS.values():
        t = targets.add_parser(target.name, help=target.help, description=target.help)
        target.add_arguments(t)
        t.set_defaults(func=command(target.run))
