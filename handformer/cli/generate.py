"""`handformer generate`: continue prompts with a language-model run, streaming."""

from __future__ import annotations

import argparse
import sys

from handformer.cli.common import (
    add_speculation_args,
    device_arg,
    non_negative_float,
    non_negative_int,
    positive_int,
    probability,
    speculation_from_args,
    unseen_notice,
)
from handformer.generation.stream import TextStream


def cmd_generate(args: argparse.Namespace) -> int:
    from handformer.generation.generate import generate, max_new_tokens_for
    from handformer.generation.speculative import SpeculationStats
    from handformer.tasks.lm.run import load_lm

    if args.prompt == "":
        raise ValueError("empty prompt: give --prompt TEXT with at least one character")
    run = load_lm(args.run_dir, args.device, decoding=True)
    speculate = speculation_from_args(args)
    bos = run.tokens.bos_id
    max_positions = run.model.cfg.max_positions
    # stdin is read line by line, so each prompt is answered as soon as it is typed.
    prompts = [args.prompt] if args.prompt is not None else (
        line.rstrip("\n") for line in sys.stdin if line.strip())
    done, notice = 0, unseen_notice(run.tokenizer)
    for text in prompts:
        notice(text)
        ids = ([bos] if bos is not None else []) + run.tokenizer.encode(text)
        max_new = args.max_new_tokens
        if max_new is None:  # default: 100 tokens, or what fits in the context window
            max_new = max(1, min(100, max_new_tokens_for(len(ids), max_positions)))
        stream, stats = TextStream(run.tokenizer, ids, prefix=text), SpeculationStats()
        generate(run.model, [ids], max_new, temperature=args.temperature, top_k=args.top_k,
                 top_p=args.top_p, seed=args.seed, stop_tokens=run.tokens.eos_ids,
                 on_token=lambda _row, token, stream=stream: stream.push(token), compile_step=args.compile,
                 speculate=speculate, stats=stats)
        stream.close()
        print(flush=True)
        if speculate is not None:
            print(stats, file=sys.stderr, flush=True)
        done += 1
    if not done:
        raise ValueError("nothing to generate from: give --prompt TEXT or prompts on stdin, one a line")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="continue a prompt with a trained or imported language model")
    p.add_argument("run_dir")
    p.add_argument("--prompt", help="text to continue; without it, one prompt per stdin line")
    p.add_argument("--max-new-tokens", type=non_negative_int, default=None,
                   help="tokens to generate (default 100, or fewer if the context window is shorter)")
    p.add_argument("--temperature", type=non_negative_float, default=1.0, help="0 = greedy (default 1.0)")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample from the K most likely tokens")
    p.add_argument("--top-p", type=probability, default=None,
                   help="sample from the smallest set of tokens with total probability >= P")
    p.add_argument("--seed", type=int, default=None, help="random seed, for reproducible samples")
    p.add_argument("--device", type=device_arg, default="cpu")
    p.add_argument("--compile", action="store_true",
                   help="run the decoding step compiled with fixed shapes (torch.compile; tens of seconds "
                   "to compile first)")
    add_speculation_args(p)
    p.set_defaults(func=cmd_generate)
