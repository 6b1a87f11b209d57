"""`handformer translate`: translate text with a trained translation run."""

from __future__ import annotations

import argparse

from handformer.cli.common import device_arg, positive_int, read_inputs, unseen_notice


def cmd_translate(args: argparse.Namespace) -> int:
    from handformer.inference.prepare import prepare_for_decoding
    from handformer.tasks.translation.job import prep_text
    from handformer.tasks.translation.translator import Translator

    translator = Translator.load(args.run_dir, args.device)
    prepare_for_decoding(translator.model)
    texts = read_inputs(args.text)
    if not any(t.strip() for t in texts):
        raise ValueError("nothing to translate: give TEXT or lines on stdin")
    kept = [t for t in texts if t.strip()]  # a blank line gives a blank line: line i answers line i
    unseen_notice(translator.src_tok)("".join(prep_text(t, translator.job.data.lowercase) for t in kept))
    outputs = iter(translator.translate(kept, beam=args.beam))
    for text in texts:
        print(next(outputs) if text.strip() else "", flush=True)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate TEXT (or stdin lines) with a trained run")
    p.add_argument("run_dir")
    p.add_argument("text", nargs="?", help="text to translate; without it, one sentence per stdin line")
    p.add_argument("--beam", type=positive_int, default=None,
                   help="beam size (1 = greedy; default from the run)")
    p.add_argument("--device", type=device_arg, default="cpu")
    p.set_defaults(func=cmd_translate)
