"""`handformer import-hf`: a Hugging Face checkpoint directory into a run."""

from __future__ import annotations

import argparse


def cmd_import_hf(args: argparse.Namespace) -> int:
    from handformer.cli.common import report_import
    from handformer.tasks.lm.imports import import_hf

    result = import_hf(args.hf_dir, args.run_dir, overwrite=args.overwrite)
    return report_import(result, args.run_dir)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import-hf", help="convert a Hugging Face checkpoint directory (safetensors; any "
                       "family `handformer families` lists) into a language-model run directory")
    p.add_argument("hf_dir", help="directory with config.json, tokenizer.json and model.safetensors "
                   "(or shards with model.safetensors.index.json)")
    p.add_argument("run_dir", help="run directory to write (for `handformer generate`)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in RUN_DIR")
    p.set_defaults(func=cmd_import_hf)
