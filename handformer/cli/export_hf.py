"""`handformer export-hf`: a run into a Hugging Face `transformers` directory (GPT-2, Llama, Qwen2,
Mistral, Gemma or Phi-3 for language models, MarianMTModel for the paper's post-norm translation model)."""

from __future__ import annotations

import argparse


def cmd_export_hf(args: argparse.Namespace) -> int:
    from handformer.cli.common import run_task

    if run_task(args.run_dir) == "translation":
        from handformer.tasks.translation.exports import export_marian

        notes = export_marian(args.run_dir, args.out_dir, overwrite=args.overwrite)
        print(f"exported MarianMTModel (marian) -> {args.out_dir}")
        for note in notes:
            print(f"note: {note}")
        print(f"next: MarianMTModel.from_pretrained({str(args.out_dir)!r}); encode with the run's "
              "tokenizer.json (sources end with </s>)")
        return 0
    from handformer.tasks.lm.exports import export_hf

    result = export_hf(args.run_dir, args.out_dir, overwrite=args.overwrite)
    print(f"exported {result.summary()}")
    for note in result.notes:
        print(f"note: {note}")
    print(f"next: AutoModelForCausalLM.from_pretrained({str(args.out_dir)!r}), "
          f"AutoTokenizer.from_pretrained({str(args.out_dir)!r})")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-hf", help="write a language-model run (trained or imported) as a Hugging "
                       "Face directory that transformers loads (GPT-2, Llama, Qwen2, Mistral, Gemma, Phi-3; "
                       "a translation run as MarianMTModel)")
    p.add_argument("run_dir", help="the language-model run to export")
    p.add_argument("out_dir", help="directory to write config.json, model.safetensors, tokenizer.json, "
                   "tokenizer_config.json and generation_config.json")
    p.add_argument("--overwrite", action="store_true", help="replace an export already in OUT_DIR")
    p.set_defaults(func=cmd_export_hf)
