"""`handformer speedrun TARGET`: end-to-end runs that build something from nothing on the machine at
hand and measure it. Each target lives in a module of its own (speedrun_<target>.py) that adds its
parser to the group through `add_target`."""

from __future__ import annotations

import argparse

from handformer.cli import speedrun_chat

TARGETS = [speedrun_chat]


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("speedrun", help="end-to-end runs from nothing, measured (targets: chat, ...)")
    targets = p.add_subparsers(dest="target", required=True, metavar="TARGET")
    for module in TARGETS:
        module.add_target(targets)
