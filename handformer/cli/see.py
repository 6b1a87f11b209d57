"""`handformer viz`, `plot` and `explain`: attention maps, training curves, and figures on the
tutorials' topics."""

from __future__ import annotations

import argparse
from pathlib import Path

from handformer.cli.common import device_arg


def language(args: argparse.Namespace) -> str:
    """`--lang` when given, else the locale's: zh for a Chinese one, else en (the rule check and
    learn follow, check/core/report.py: default_language)."""
    from handformer.check.core.report import default_language

    return args.lang or default_language()


def cmd_viz(args: argparse.Namespace) -> int:
    from handformer.see.viz import visualize

    report, files = visualize(args.run_dir, args.text, args.out, args.layer, args.head,
                              args.max_new_tokens, args.device, language(args))
    if report.task == "translation":
        print(f"source:      {report.text}\ntranslation: {report.output}")
    else:
        print(f"prompt:    {report.text}\ngenerated: {report.output!r} (greedy)")
    pngs = [f for f in files if f.suffix == ".png"]
    print(f"wrote {len(pngs)} heatmaps to {files[-1].parent}:")
    for f in pngs:
        print(f"  {f.name}")
    print(f"explorer (open in a browser): {files[-1]}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from handformer.see.plots import plot_runs

    out = args.out or (Path(args.run_dirs[0]) / "training_curves.png" if len(args.run_dirs) == 1
                       else Path("runs_comparison.png"))
    print(f"wrote {plot_runs(args.run_dirs, out)}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from handformer.see.explain import explain

    for path in explain(args.out, language(args)):
        print(f"wrote {path}")
    return 0


def cmd_experts(args: argparse.Namespace) -> int:
    from handformer.see.experts import expert_choices, figure_experts

    choices = expert_choices(args.run_dir, args.text, args.device)
    out = Path(args.out) if args.out else Path(args.run_dir) / "experts.png"
    figure_experts(choices, out, language(args), args.layer)
    L, E = choices.counts.shape
    if choices.dropped:
        print(f"TEXT is {len(choices.tokens) + choices.dropped} tokens; the model's context holds "
              f"{len(choices.tokens)}: the first {len(choices.tokens)} are shown")
    print(f"{len(choices.tokens)} tokens, {L} mixture layers of {E} experts, top {choices.top_k}:")
    for i, counts in enumerate(choices.counts.tolist()):
        print(f"  layer {i}: tokens per expert {counts}")
    print(f"wrote {out}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("viz", help="attention heatmaps and an HTML explorer for TEXT run through a "
                       "trained run (translation or language model)")
    p.add_argument("run_dir")
    p.add_argument("text", help="a sentence to translate, or a prompt to continue")
    p.add_argument("--layer", type=int, default=None, help="only this layer (from 0; default all)")
    p.add_argument("--head", type=int, default=None,
                   help="this head (from 0) instead of the grid of all heads")
    p.add_argument("--out", default=None, help="output directory (default RUN_DIR/viz)")
    p.add_argument("--max-new-tokens", type=int, default=8,
                   help="language models: tokens to generate greedily after TEXT (default 8)")
    p.add_argument("--lang", choices=("en", "zh"), default=None,
                   help="language of the explorer page attention.html: en, or zh (Chinese); default: "
                   "from the locale, as check and learn choose it; the PNGs' titles stay English")
    p.add_argument("--device", type=device_arg, default="cpu")
    p.set_defaults(func=cmd_viz)

    p = sub.add_parser("experts", help="where a mixture of experts' routers send each token of TEXT: "
                       "tokens per expert in every layer, and one layer's router weights (a PNG)")
    p.add_argument("run_dir", help="a language-model run with [model] moe (trained or imported)")
    p.add_argument("text", help="the text to run through the model")
    p.add_argument("--layer", type=int, default=0, help="the layer whose router weights are drawn (from 0)")
    p.add_argument("--lang", default=None, choices=["en", "zh"],
                   help="language of titles and labels (default: from the locale, zh for a Chinese one)")
    p.add_argument("--out", default=None, help="PNG to write (default RUN_DIR/experts.png)")
    p.add_argument("--device", type=device_arg, default="cpu")
    p.set_defaults(func=cmd_experts)

    p = sub.add_parser("plot", help="loss and learning rate against step and wall time, runs overlaid")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories with metrics.jsonl")
    p.add_argument("--out", default=None, help="PNG to write (default RUN_DIR/training_curves.png for "
                   "one run, runs_comparison.png for several)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("explain", help="draw figures on the tutorials' topics (softmax, scaling, positions, "
                       "top-k/top-p, masks, data flow) from handformer's code")
    p.add_argument("--lang", choices=("en", "zh"), default=None,
                   help="language of titles and labels: en, or zh (Chinese; needs a CJK font, else "
                   "a warning and English labels); default: from the locale, zh for a Chinese one")
    p.add_argument("--out", default=None,
                   help="output directory (default runs/explain, or runs/explain/zh with --lang zh; "
                   "docs/figures and docs/zh/figures hold the committed ones)")
    p.set_defaults(func=cmd_explain)
