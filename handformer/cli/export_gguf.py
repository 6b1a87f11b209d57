"""`handformer export-gguf`: a language-model run as one GGUF file for llama.cpp (and ollama, LM
Studio, llamafile, which are built on it)."""

from __future__ import annotations

import argparse


def cmd_export_gguf(args: argparse.Namespace) -> int:
    from handformer.tasks.lm.exports import export_gguf

    result = export_gguf(args.run_dir, args.out, args.type, overwrite=args.overwrite)
    print(f"exported {result.summary()}")
    for note in result.notes:
        print(f"note: {note}")
    print(f'next: llama-completion -m {args.out} -no-cnv -p "Once upon a time" -n 64 --temp 0')
    return 0


TYPES = ("f32", "f16", "q8_0", "q4_0")  # gguf_export.TYPES, here so that building the parser imports nothing


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-gguf", help="write a language-model run (trained, fine-tuned or imported) as "
                       "a GGUF file that llama.cpp runs (Llama, Qwen2, Qwen3, Qwen3-MoE, Gemma, Gemma 2, "
                       "Gemma 3, OLMo 2, SmolLM3, Phi-3, GPT-2)")
    p.add_argument("run_dir", help="the language-model run to export")
    p.add_argument("out", help="the .gguf file to write")
    p.add_argument("--type", choices=TYPES, default="f32",
                   help="tensor type of the matrices: f32 (exact), f16, q8_0 (8-bit blocks) or q4_0 (4-bit "
                   "blocks); norms and "
                   "biases stay f32 (default f32)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    p.set_defaults(func=cmd_export_gguf)
