"""`handformer eval`: BLEU and loss of translation runs, perplexity of language models."""

from __future__ import annotations

import argparse
from typing import Any

from handformer.cli.common import device_arg, positive_int, run_task
from handformer.io import atomic_write_text


def cmd_eval_lm(args: argparse.Namespace) -> int:
    from handformer.tasks.lm.run import load_lm
    from handformer.tasks.lm.scoring import eval_text, score_text

    if len(args.data) != 1:
        raise ValueError("a language model scores one text: --data FILE_OR_FOLDER, 'val' (the run's "
                         "own validation split) or 'pydoc' (the embedded corpus)")
    for name in ("beam", "output"):
        if getattr(args, name) is not None:
            raise ValueError(f"--{name} is for translation runs; {args.run_dir} holds a language model")
    run = load_lm(args.run_dir, args.device)
    score = score_text(run, eval_text(run, args.data[0]), args.block_size, args.limit, args.stride)
    print(score.format())
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    if run_task(args.run_dir) == "lm":
        return cmd_eval_lm(args)
    for name in ("block_size", "stride"):
        if getattr(args, name) is not None:
            raise ValueError(f"--{name.replace('_', '-')} is for language-model runs (task 'lm')")
    from handformer.tasks.translation.job import batched_pairs, load_pairs
    from handformer.tasks.translation.scores import corpus_scores
    from handformer.tasks.translation.train import seq2seq_loss
    from handformer.tasks.translation.translator import Translator
    from handformer.training.loop import evaluate

    if len(args.data) > 2 or (len(args.data) == 2 and "dates" in args.data):
        raise ValueError(f"--data takes one TSV file, two aligned files (source target) or 'dates'; "
                         f"got {len(args.data)} paths: {' '.join(args.data)}")
    translator = Translator.load(args.run_dir, args.device)
    if args.data == ["dates"]:
        _, _, data = load_pairs(translator.job.data)
    elif args.data in (["val"], ["test"]):
        data = _own_split(translator.job.data, args.data[0], args.run_dir)
    else:
        from handformer.tasks.translation.job import load_split

        data = load_split(args.data if len(args.data) == 2 else args.data[0],
                          translator.job.data.lowercase)
    pairs = data.pairs[: args.limit] if args.limit else data.pairs
    print(data.report())
    max_len = min(translator.job.data.max_length, translator.model.cfg.max_positions)
    batches = batched_pairs(translator.job, pairs, translator.src_tok, translator.tgt_tok, max_len,
                            shuffle=False).epoch(0)
    loss = evaluate(translator.model, batches, seq2seq_loss, translator.device)
    hyps = translator.translate([s for s, _ in pairs], beam=args.beam)
    scores = corpus_scores(hyps, [t for _, t in pairs])
    beam = translator.job.decode.beam if args.beam is None else args.beam
    print(f"loss {loss:.4f} per token  {scores.format()}  beam {beam}")
    print(f"sacreBLEU signature: {scores.signature}")
    if args.output:
        atomic_write_text(args.output, "".join(h + "\n" for h in hyps))
        print(f"translations written to {args.output}")
    return 0


def _own_split(cfg: Any, name: str, run_dir: str) -> Any:
    """The run's own validation or test pairs, as its config names them (a dataset's files are
    found on this machine or downloaded)."""
    from handformer.tasks.translation.job import load_pairs, load_split

    if cfg.train == "dates" and not cfg.dataset:
        return load_pairs(cfg)[1]  # the embedded task's held-out dates: its val and test are one
    spec = cfg.split(name)
    if spec is None:
        raise ValueError(f"{run_dir} was trained without a {name} split ([data] {name} and dataset are "
                         "unset); give --data TSV, or two aligned files SOURCE TARGET")
    return load_split(spec, cfg.lowercase)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="translation runs: loss, BLEU and chrF on parallel data; "
                       "language models: loss and perplexity on a text")
    p.add_argument("run_dir")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH",
                   help="translation: a TSV file, two aligned files (source target), 'val' or 'test' "
                   "(the run's own splits) or 'dates' (embedded held-out); language model: a text file "
                   "or folder (plain or .gz), "
                   "'val' (the run's own validation split, all of it) or 'pydoc'")
    p.add_argument("--beam", type=positive_int, default=None, help="beam size (1 = greedy; default "
                   "from the run)")
    p.add_argument("--limit", type=int, default=0,
                   help="score only the first N pairs (translation) or windows (language model)")
    p.add_argument("--block-size", type=int, default=None,
                   help="language model: tokens per scored window (default: the training block "
                   "size; for imported runs the context length, at most 1024)")
    p.add_argument("--stride", type=int, default=None,
                   help="language model: slide the window by N tokens, scoring only its last N "
                   "(more context per token; default: the block size, windows do not overlap)")
    p.add_argument("--output", help="write the translations to this file")
    p.add_argument("--device", type=device_arg, default="cpu")
    p.set_defaults(func=cmd_eval)
