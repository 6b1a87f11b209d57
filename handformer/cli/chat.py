"""`handformer chat`: talk to an instruction-tuned run, one message a line, replies streamed."""

from __future__ import annotations

import argparse
import sys

from handformer.cli.common import (
    add_speculation_args,
    device_arg,
    non_negative_float,
    positive_int,
    probability,
    speculation_from_args,
)


def cmd_chat(args: argparse.Namespace) -> int:
    from handformer.tasks.lm.chat import chat

    speculate = speculation_from_args(args)
    session = chat(args.run_dir, system=args.system, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, max_new_tokens=args.max_new_tokens,
                   device=args.device, notify=lambda note: print(f"note: {note}", file=sys.stderr),
                   speculate=speculate, thinking=args.think)
    interactive = sys.stdin.isatty()
    failed = False
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:  # end of input (Ctrl-D)
            break
        text = line.rstrip("\n")
        if not text.strip():
            continue
        try:
            session.send(text, on_text=lambda piece: print(piece, end="", flush=True))
        except ValueError as err:  # this message could not be answered; the conversation goes on
            print(f"error: {err}", file=sys.stderr)
            failed = True
            continue
        print(flush=True)
        if speculate is not None:
            print(f"note: {session.speculation}", file=sys.stderr, flush=True)
    return 2 if failed else 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with an instruction-tuned run (its own chat template; "
                       "one message per stdin line, replies streamed)")
    p.add_argument("run_dir")
    p.add_argument("--system", default=None, help="system message that opens the conversation")
    p.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help="longest reply, in tokens (default 256, or half the context if shorter)")
    p.add_argument("--temperature", type=non_negative_float, default=1.0, help="0 = greedy (default 1.0)")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample from the K most likely tokens")
    p.add_argument("--top-p", type=probability, default=None,
                   help="sample from the smallest set of tokens with total probability >= P")
    p.add_argument("--seed", type=int, default=None, help="random seed, for reproducible replies")
    p.add_argument("--think", action=argparse.BooleanOptionalAction, default=None,
                   help="the chat template's thinking switch (enable_thinking): --think reasons in "
                   "<think>...</think> before the answer, --no-think answers at once (default: the "
                   "template's own choice)")
    p.add_argument("--device", type=device_arg, default="cpu")
    add_speculation_args(p)
    p.set_defaults(func=cmd_chat)
