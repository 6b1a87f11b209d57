"""`handformer speedrun TARGET`: end-to-end runs that build something from nothing on the machine at
hand and measure it. Each target lives in a module of its own (speedrun_<target>.py) whose
`add_target` adds its parser to the group."""

from __future__ import annotations

import argparse

from handformer.cli.speedrun_chat import add_target as add_chat

TARGETS = [add_chat]  # one add_target a target


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("speedrun", help="end-to-end runs from nothing, measured (targets: chat, ...)")
    targets = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    for add_target in TARGETS:
        add_target(targets)
