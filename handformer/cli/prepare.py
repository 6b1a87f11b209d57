"""`handformer prepare`: tokenize a corpus once into memory-mapped shards for training."""

from __future__ import annotations

import argparse


def cmd_prepare(args: argparse.Namespace) -> int:
    from handformer.data.prepare import prepare

    try:
        prepare(args.source, args.out_dir, args.tokenizer, val_fraction=args.val_fraction,
                shard_tokens=args.shard_tokens, sample_mb=args.sample_mb, text_field=args.text_field,
                progress=not args.no_progress)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(f"{args.out_dir} keeps its finished shards; run the same command again "
                                "to go on from them") from None
    print(f'train on it with [data] shards = "{args.out_dir}" (or --set data.shards={args.out_dir})')
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="tokenize text into token shards (train with [data] shards)")
    p.add_argument("source", help="a text file, a folder of files, .gz, or .jsonl with a text field")
    p.add_argument("out_dir", help="folder for the shards, tokenizer.json and manifest.json")
    p.add_argument("--tokenizer", required=True, metavar="RUN_DIR|FILE|char|bpe:N",
                   help="a run directory or tokenizer.json to reuse, char, or bpe:N (trained here)")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="fraction of documents for validation, spread evenly (default 0.1)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000,
                   help="tokens per shard (default 100,000,000, as llm.c)")
    p.add_argument("--sample-mb", type=float, default=64.0,
                   help="megabytes of training text a char or bpe:N tokenizer learns from (default 64)")
    p.add_argument("--text-field", default="text", help="the JSONL field holding the text (default text)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_prepare)
