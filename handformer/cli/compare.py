"""`handformer compare`: a run beside the transformers model it was ported from, stage by stage."""

from __future__ import annotations

import argparse
from pathlib import Path

from handformer.paths import missing_from


def cmd_compare(args: argparse.Namespace) -> int:
    import torch

    from handformer.convert.compare import first_divergence
    from handformer.tasks.lm.run import load_lm

    try:
        import transformers
    except ImportError:
        raise ValueError("compare runs the model in transformers, which is not installed: "
                         "pip install transformers") from None
    if not args.prompt:
        raise ValueError("empty prompt: give --prompt TEXT with at least one character")
    if not (Path(args.hf_dir) / "config.json").is_file():  # else transformers asks the Hub for it
        raise ValueError(f"{args.hf_dir} is not a Hugging Face checkpoint folder "
                         f"({missing_from(args.hf_dir, 'config.json')}); give the folder import-hf read, or "
                         "one `handformer export-hf` wrote")
    run = load_lm(args.run_dir)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(
        args.hf_dir, dtype=torch.float32, attn_implementation="eager")
    bos = run.tokens.bos_id
    ids = torch.tensor([([bos] if bos is not None else []) + run.tokenizer.encode(args.prompt)])  # (1, T)
    found = first_divergence(run.model.float(), hf_model, ids, atol=args.atol)
    print(found.report())
    return 1 if found.first else 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="run a language-model run and a transformers checkpoint on one prompt "
                       "and print the largest difference at each stage (embeddings, each block's attention "
                       "and FFN, final norm, logits); exit 1 when one passes --atol")
    p.add_argument("run_dir", help="language-model run directory (e.g. imported with import-hf)")
    p.add_argument("hf_dir", help="Hugging Face checkpoint directory transformers loads")
    p.add_argument("--prompt", required=True, help="text to run through both")
    p.add_argument("--atol", type=float, default=1e-4, help="largest difference that counts as equal")
    p.set_defaults(func=cmd_compare)
