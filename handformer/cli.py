"""The `handformer` command line. Each subcommand is a thin layer over the library."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from handformer.config import BlockConfig, config_from_dict, load_config


def parse_value(text: str) -> Any:
    """'3' -> 3, '0.1' -> 0.1, 'true' -> True, 'none' -> None, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"error: --set expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        out[key.strip()] = parse_value(value)
    return out


def model_config_from_args(source: str, overrides: dict[str, Any]) -> BlockConfig:
    """A preset name, a config JSON file, or a run directory holding config.json."""
    from handformer.trace import PRESETS

    if source in PRESETS:
        cfg = PRESETS[source]()
        data = cfg.to_dict()
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise SystemExit(f"error: {source!r} is neither a preset ({', '.join(PRESETS)}) nor a "
                             "config file or run directory")
        data = load_config(path).to_dict()
    unknown = set(overrides) - set(data)
    if unknown:
        raise SystemExit(f"error: unknown config field(s) {', '.join(sorted(unknown))}; valid: "
                         f"{', '.join(sorted(k for k in data if k != 'family'))}")
    return config_from_dict({**data, **overrides})


def cmd_trace(args: argparse.Namespace) -> int:
    from handformer.trace import build_model, format_trace, trace

    cfg = model_config_from_args(args.model, parse_overrides(args.set))
    model = build_model(cfg)
    rows = trace(model, args.batch_size, args.src_length, args.tgt_length)
    print(f"{type(model).__name__} ({cfg.family}): {model.num_parameters():,} parameters")
    print(format_trace(rows, args.depth))
    return 0


def _job(args: argparse.Namespace) -> dict[str, Any]:
    from handformer.job_config import apply_overrides, load_job_file

    return apply_overrides(load_job_file(args.config), parse_overrides(args.set))


def _print_table(rows: list[tuple[str, ...]], headers: tuple[str, ...], width: int = 48) -> None:
    cut = [tuple(c if len(c) <= width else c[: width - 1] + "…" for c in row) for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cut)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cut:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def cmd_train(args: argparse.Namespace) -> int:
    if args.resume:
        run_dir = Path(args.resume)
        config_path = run_dir / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"cannot resume: {run_dir} has no config.json")
        if not (run_dir / "checkpoint.safetensors").is_file():
            raise FileNotFoundError(f"cannot resume: {run_dir} has no checkpoint.safetensors yet")
        saved = json.loads(config_path.read_text())
        job_dict = {k: v for k, v in saved.items() if k in ("task", "train", "data", "decode")}
        job_dict["model"] = {k: v for k, v in saved["model"].items()  # sizes come from tokenizers
                             if k not in ("family", "src_vocab_size", "tgt_vocab_size", "vocab_size",
                                          "pad_id")}
        if args.set:
            from handformer.job_config import apply_overrides
            job_dict = apply_overrides(job_dict, parse_overrides(args.set))
    else:
        if not args.config:
            raise SystemExit("error: give --config FILE.toml (or a built-in name) or --resume RUN_DIR")
        job_dict = _job(args)
        run_dir = Path(args.out)
        if (run_dir / "checkpoint.safetensors").exists() and not args.overwrite:
            raise SystemExit(f"error: {run_dir} already holds a run; use --resume {run_dir} to "
                             "continue it, --overwrite to start over, or another --out")
    task = job_dict.pop("task", "translation")
    if task == "translation":
        from handformer.translation import TranslationJob, run_train

        _, result = run_train(TranslationJob.from_dict(job_dict), run_dir, resume=bool(args.resume))
    elif task == "lm":
        from handformer.lm import LMJob, run_train_lm

        _, result = run_train_lm(LMJob.from_dict(job_dict), run_dir, resume=bool(args.resume))
    else:
        raise SystemExit(f"error: unknown task {task!r} in the config; use translation or lm")
    from handformer.distributed import env_rank
    from handformer.plots import plot_loss_curve

    if env_rank() != 0:  # under torchrun, rank 0 alone writes the plot and reports
        return 0

    curve = plot_loss_curve(run_dir)
    best = "n/a" if result.best_val_loss is None else f"{result.best_val_loss:.4f}"
    print(f"done: {result.step} steps in {result.elapsed_s:.0f} s, best val loss {best}")
    print(f"run directory: {run_dir} (model.safetensors, metrics.jsonl, {curve.name})")
    return 0


def _read_inputs(text: str | None) -> list[str]:
    if text is not None:
        return [text]
    lines = [line.rstrip("\n") for line in sys.stdin]
    return [line for line in lines if line.strip()]


def cmd_translate(args: argparse.Namespace) -> int:
    from handformer.translation import Translator

    translator = Translator.load(args.run_dir, args.device)
    texts = _read_inputs(args.text)
    if not texts:
        raise ValueError("nothing to translate: give TEXT or lines on stdin")
    for line in translator.translate(texts, beam=args.beam):
        print(line, flush=True)
    return 0


def _run_task(run_dir: str) -> str | None:
    """The task recorded in a run directory's config.json (None when there is none to read)."""
    path = Path(run_dir) / "config.json"
    try:
        return json.loads(path.read_text()).get("task")
    except (OSError, ValueError, AttributeError):
        return None


def cmd_eval_lm(args: argparse.Namespace) -> int:
    from handformer.lm import eval_text, load_lm, score_text

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
    if _run_task(args.run_dir) == "lm":
        return cmd_eval_lm(args)
    for name in ("block_size", "stride"):
        if getattr(args, name) is not None:
            raise ValueError(f"--{name.replace('_', '-')} is for language-model runs (task 'lm')")
    from handformer.scores import corpus_scores
    from handformer.train import evaluate
    from handformer.translation import Translator, batched_pairs, load_pairs, seq2seq_loss

    translator = Translator.load(args.run_dir, args.device)
    if args.data == ["dates"]:
        _, _, data = load_pairs(translator.job.data)
    else:
        from handformer.translation import load_split

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
        Path(args.output).write_text("".join(h + "\n" for h in hyps))
        print(f"translations written to {args.output}")
    return 0


class TextStream:
    """Writes a generation's text as it grows, one token at a time.

    The text is decoded from prompt + new ids, and what follows the decoded prompt is shown (so a
    tokenizer that drops a word's leading space at the start of a text still shows it). Output is
    held back while the text ends with U+FFFD: the last tokens may be an incomplete UTF-8 character
    that the next byte-level token completes. `prefix` (the prompt as typed) is written first, once
    there is output (on the first token or at close, so a failed run prints nothing)."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int], prefix: str = "", out: Any = None,
                 ) -> None:
        self.tokenizer = tokenizer
        self.prompt_ids = list(prompt_ids)
        self.prompt_text = tokenizer.decode(self.prompt_ids)
        self.new_ids: list[int] = []
        self.out = out if out is not None else sys.stdout
        self.prefix = prefix  # written with the first output
        self.shown = 0  # characters of the new text written so far

    def text(self) -> str:
        full = self.tokenizer.decode(self.prompt_ids + self.new_ids)
        if full.startswith(self.prompt_text):
            return full[len(self.prompt_text):]
        return self.tokenizer.decode(self.new_ids)

    def push(self, token_id: int) -> None:
        self.new_ids.append(token_id)
        text = self.text()
        if not text.endswith("\ufffd"):
            self._write(text)

    def close(self) -> None:
        self._write(self.text())

    def _write(self, text: str) -> None:
        if self.prefix:
            self.out.write(self.prefix)
            self.prefix = ""
        if len(text) > self.shown:
            self.out.write(text[self.shown:])
            self.out.flush()
            self.shown = len(text)


def cmd_generate(args: argparse.Namespace) -> int:
    from handformer.generate import generate
    from handformer.lm import load_lm

    if args.prompt == "":
        raise ValueError("empty prompt: give --prompt TEXT with at least one character")
    run = load_lm(args.run_dir, args.device)
    bos, eos = run.tokens.bos_id, run.tokens.eos_id
    max_positions = run.model.cfg.max_positions
    # stdin is read line by line, so each prompt is answered as soon as it is typed.
    prompts = [args.prompt] if args.prompt is not None else (
        line.rstrip("\n") for line in sys.stdin if line.strip())
    done = 0
    for text in prompts:
        ids = ([bos] if bos is not None else []) + run.tokenizer.encode(text)
        max_new = args.max_new_tokens
        if max_new is None:  # default: 100 tokens, or what fits in the context window
            max_new = max(1, min(100, max_positions - len(ids)))
        stream = TextStream(run.tokenizer, ids, prefix=text)
        generate(run.model, [ids], max_new, temperature=args.temperature, top_k=args.top_k,
                 top_p=args.top_p, seed=args.seed, stop_tokens=() if eos is None else (eos,),
                 on_token=lambda _row, token, stream=stream: stream.push(token))
        stream.close()
        print(flush=True)
        done += 1
    if not done:
        raise ValueError("nothing to generate from: give --prompt TEXT or prompts on stdin, one a line")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import time

    from handformer.job_config import apply_overrides, load_job_file
    from handformer.plots import plot_attention, plot_loss_curve
    from handformer.scores import corpus_scores
    from handformer.translation import TranslationJob, Translator, attention_maps, load_pairs, run_train

    start = time.perf_counter()
    job = TranslationJob.from_dict(
        {k: v for k, v in apply_overrides(load_job_file("demo"), parse_overrides(args.set)).items()
         if k != "task"})
    run_dir = Path(args.out)
    print("handformer demo: teach a small Transformer to translate dates written in words into ISO "
          "dates\n(e.g. 'the twenty-third of march, nineteen ninety-seven' -> '1997-03-23').\n")
    run_train(job, run_dir)
    translator = Translator.load(run_dir)
    _, _, heldout = load_pairs(job.data)
    sources = [s for s, _ in heldout.pairs]
    refs = [t for _, t in heldout.pairs]
    hyps = translator.translate(sources)
    scores = corpus_scores(hyps, refs)
    print()
    _print_table([(s, h, r, "yes" if h == r else "NO") for s, h, r in
                  zip(sources[: args.examples], hyps[: args.examples], refs[: args.examples])],
                 ("source (held out)", "model output", "reference", "ok"))
    print(f"\nheld-out exact match: {100 * scores.exact_match:.1f}% of {scores.n} dates never seen "
          "in training")
    example = sources[0]
    maps = attention_maps(translator, example)
    heat = plot_attention(maps["cross"][-1].mean(0), maps["source_tokens"], maps["output_tokens"],
                          run_dir / "cross_attention.png",
                          title=f"cross-attention, last decoder layer, mean of heads\n{example}",
                          x_title="source tokens", y_title="output token being produced")
    curve = plot_loss_curve(run_dir)
    print(f"cross-attention heatmap: {heat}\nloss curve: {curve}")
    print(f"run directory: {run_dir}  (try: handformer translate {run_dir} \"the first of may, "
          f"twenty twenty\")")
    print(f"total time: {time.perf_counter() - start:.0f} s")
    return 0


def cmd_import_hf(args: argparse.Namespace) -> int:
    from handformer.hf_import import import_hf

    result = import_hf(args.hf_dir, args.run_dir, overwrite=args.overwrite)
    print(f"imported {result.summary()}")
    for note in result.notes:
        print(f"note: {note}")
    print(f'next: handformer generate {args.run_dir} --prompt "Once upon a time" --temperature 0')
    return 0


def cmd_viz(args: argparse.Namespace) -> int:
    from handformer.viz import visualize

    report, files = visualize(args.run_dir, args.text, args.out, args.layer, args.head,
                              args.max_new_tokens, args.device)
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
    from handformer.plots import plot_runs

    out = args.out or (Path(args.run_dirs[0]) / "training_curves.png" if len(args.run_dirs) == 1
                       else Path("runs_comparison.png"))
    print(f"wrote {plot_runs(args.run_dirs, out)}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from handformer.explain import explain

    for path in explain(args.out):
        print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="handformer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("trace", help="print every module's input/output shapes and parameter counts")
    p.add_argument("model", nargs="?", default="paper-base",
                   help="preset (paper-base, gpt2, llama), a config JSON file or a run directory")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model config field, e.g. --set n_encoder_layers=2")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--src-length", type=int, default=10, help="source (or prompt) length")
    p.add_argument("--tgt-length", type=int, default=5, help="target length (encoder-decoder)")
    p.add_argument("--depth", type=int, default=None, help="show modules down to this depth")
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("demo", help="train a small translator on the embedded dates task, in minutes")
    p.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    p.add_argument("--examples", type=int, default=10, help="held-out examples to show")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the demo config, e.g. --set train.steps=300")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a model from a TOML config")
    p.add_argument("--config", help="TOML file, or a built-in config name (demo)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field: section.key=value, e.g. train.steps=500")
    p.add_argument("--out", default="runs/train", help="run directory (default runs/train)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start over in an existing run directory")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("translate", help="translate TEXT (or stdin lines) with a trained run")
    p.add_argument("run_dir")
    p.add_argument("text", nargs="?", help="text to translate; without it, one sentence per stdin line")
    p.add_argument("--beam", type=int, default=None, help="beam size (1 = greedy; default from the run)")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("generate", help="continue a prompt with a trained or imported language model")
    p.add_argument("run_dir")
    p.add_argument("--prompt", help="text to continue; without it, one prompt per stdin line")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens to generate (default 100, or fewer if the context window is shorter)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="sample from the K most likely tokens")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample from the smallest set of tokens with total probability >= P")
    p.add_argument("--seed", type=int, default=None, help="random seed, for reproducible samples")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("eval", help="translation runs: loss, BLEU and chrF on parallel data; "
                       "language models: loss and perplexity on a text")
    p.add_argument("run_dir")
    p.add_argument("--data", nargs="+", required=True, metavar="PATH",
                   help="translation: a TSV file, two aligned files (source target), or 'dates' "
                   "(embedded held-out); language model: a text file or folder (plain or .gz), "
                   "'val' (the run's own validation split, all of it) or 'pydoc'")
    p.add_argument("--beam", type=int, default=None)
    p.add_argument("--limit", type=int, default=0,
                   help="score only the first N pairs (translation) or windows (language model)")
    p.add_argument("--block-size", type=int, default=None,
                   help="language model: tokens per scored window (default: the training block "
                   "size; for imported runs the context length, at most 1024)")
    p.add_argument("--stride", type=int, default=None,
                   help="language model: slide the window by N tokens, scoring only its last N "
                   "(more context per token; default: the block size, windows do not overlap)")
    p.add_argument("--output", help="write the translations to this file")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser("import-hf", help="convert a Hugging Face GPT-2 / Llama checkpoint directory "
                       "(safetensors) into a language-model run directory")
    p.add_argument("hf_dir", help="directory with config.json, tokenizer.json and model.safetensors "
                   "(or shards with model.safetensors.index.json)")
    p.add_argument("run_dir", help="run directory to write (for `handformer generate`)")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in RUN_DIR")
    p.set_defaults(func=cmd_import_hf)

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
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_viz)

    p = sub.add_parser("plot", help="loss and learning rate against step and wall time, runs overlaid")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories with metrics.jsonl")
    p.add_argument("--out", default=None, help="PNG to write (default RUN_DIR/training_curves.png for "
                   "one run, runs_comparison.png for several)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("explain", help="redraw the tutorials' figures (softmax, scaling, positions, "
                       "masks, data flow) from handformer's code")
    p.add_argument("--out", default="docs/figures", help="output directory (default docs/figures)")
    p.set_defaults(func=cmd_explain)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
