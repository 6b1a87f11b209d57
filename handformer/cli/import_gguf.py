"""`handformer import-gguf`: a GGUF model file (llama.cpp's format) into a run."""

from __future__ import annotations

import argparse


def cmd_import_gguf(args: argparse.Namespace) -> int:
    from handformer.cli.common import report_import
    from handformer.tasks.lm.imports import import_gguf

    result = import_gguf(args.gguf_file, args.run_dir, overwrite=args.overwrite, int4=args.int4)
    return report_import(result, args.run_dir)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import-gguf", help="convert a GGUF model file (Llama, Qwen2, Qwen3, Qwen3-MoE, "
                       "Gemma, Gemma 2, Gemma 3, OLMo 2, SmolLM3, Phi-3, GPT-2; F32, F16, BF16, Q8_0, Q4_0, "
                       "Q4_K, Q5_K, Q6_K) into a language-model run directory")
    p.add_argument("gguf_file", help="the .gguf file to read")
    p.add_argument("run_dir", help="run directory to write (for `handformer generate`)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in RUN_DIR")
    p.add_argument("--int4", action="store_true", help="keep the file's Q4_0 matrices 4-bit: an int4 run "
                   "(groups of 32, the file's scales) instead of float32 weights")
    p.set_defaults(func=cmd_import_gguf)
