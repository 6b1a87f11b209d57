"""`handformer quantize`: an int8, int4 or bf16 copy of a language-model run."""

from __future__ import annotations

import argparse


def cmd_quantize(args: argparse.Namespace) -> int:
    from handformer.tasks.lm.quantize import native_bf16, quantize_run

    chosen = [name for name in ("int8", "int4", "bf16") if getattr(args, name)]
    if len(chosen) != 1:
        raise ValueError("choose one format: --int8 (weight-only, per output channel), --int4 "
                         "(weight-only, in groups) or --bf16")
    weights = chosen[0]
    if weights == "bf16" and args.keep_head_fp32:
        raise ValueError("--keep-head-fp32 is for --int8 and --int4; --bf16 converts every weight")
    if weights != "int4" and args.group_size is not None:
        raise ValueError("--group-size is for --int4")
    if weights == "bf16":
        native, sentence = native_bf16()
        print(("" if native else "warning: ") + sentence)
    group_size = 32 if args.group_size is None else args.group_size  # 0 is refused, not the default
    names, spec = quantize_run(args.run_dir, args.out_dir, weights, head=not args.keep_head_fp32,
                               overwrite=args.overwrite, group_size=group_size)
    if weights == "bf16":
        print(f"bf16: every weight in bfloat16 -> {args.out_dir}")
    else:
        head = "included" if "lm_head" in names else "kept in fp32"  # a soft-capped head (Gemma 2) stays
        groups = f", groups of {spec.group_size}" if weights == "int4" else ""
        print(f"{weights}: {len(names)} linear layers quantized (output head {head}{groups}) "
              f"-> {args.out_dir}")
    print(f"next: handformer eval {args.out_dir} --data val   |   handformer generate {args.out_dir} "
          '--prompt "..."')
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="write an int8 / int4 (weight-only) or bf16 copy of a "
                       "language-model run, which generate and eval load as they are")
    p.add_argument("run_dir", help="the float language-model run to quantize")
    p.add_argument("out_dir", help="the run directory to write")
    p.add_argument("--int8", action="store_true", help="int8 weights, per output channel, symmetric, "
                   "for every linear layer (embeddings stay fp32)")
    p.add_argument("--int4", action="store_true", help="4-bit weights in groups along the input, "
                   "asymmetric, for every linear layer (layers whose width the group does not divide: int8)")
    p.add_argument("--group-size", type=int, default=None, help="with --int4: inputs per group, 32 "
                   "(default), 64, 128 or 256")
    p.add_argument("--bf16", action="store_true", help="every weight in bfloat16")
    p.add_argument("--keep-head-fp32", action="store_true",
                   help="with --int8 / --int4: leave the output head (lm_head) in fp32")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in OUT_DIR")
    p.set_defaults(func=cmd_quantize)
