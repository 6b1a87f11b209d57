"""`handformer import-llama2c`: a llama2.c checkpoint and tokenizer into a run."""

from __future__ import annotations

import argparse


def cmd_import_llama2c(args: argparse.Namespace) -> int:
    from handformer.cli.common import report_import
    from handformer.data.lookup import given_or_dataset_file
    from handformer.tasks.lm.imports import import_llama2c

    model, tokenizer = given_or_dataset_file(args.model), given_or_dataset_file(args.tokenizer)
    result = import_llama2c(model, tokenizer, args.run_dir, overwrite=args.overwrite)
    return report_import(result, args.run_dir)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import-llama2c", help="convert a llama2.c checkpoint (model.bin, legacy or "
                       "version 1) and its tokenizer.bin into a language-model run directory")
    p.add_argument("model", help="llama2.c checkpoint, e.g. stories15M.bin; stories260K.bin, not in "
                   "this folder, is the stories260K dataset's (`handformer data get stories260K`)")
    p.add_argument("tokenizer", help="llama2.c tokenizer, e.g. tok512.bin or tokenizer.bin")
    p.add_argument("run_dir", help="run directory to write (for `handformer generate`)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in RUN_DIR")
    p.set_defaults(func=cmd_import_llama2c)
