"""`handformer train` and `handformer demo`: train a run from a TOML config."""

from __future__ import annotations

import argparse
from pathlib import Path

from handformer.cli.common import job_from_args, parse_overrides, positive_int, print_table
from handformer.paths import found_at

DEFAULT_OUT = "runs/train"


def apply_set(job_dict: dict, pairs: list[str]) -> dict:
    from handformer.tasks.job_file import apply_overrides

    return apply_overrides(job_dict, parse_overrides(pairs)) if pairs else job_dict


def resumed_job(args: argparse.Namespace) -> tuple[Path, dict]:
    """The run directory and job of `train --resume RUN`: the run's own config.json plus --set."""
    given = [f"--{name.replace('_', '-')}" for name in ("config", "out", "overwrite", "init_from")
             if getattr(args, name)]
    if given:
        raise ValueError(f"--resume {args.resume} continues that run with its own config and "
                         f"directory; {' and '.join(given)} would be ignored: drop "
                         f"{'them' if len(given) > 1 else 'it'} (change settings with --set), "
                         "or start a new run with --config and --out")
    from handformer.config import CausalLMConfig, Seq2SeqConfig
    from handformer.tasks.run_config import read_run_config, run_model_config

    run_dir = Path(args.resume)
    if not run_dir.is_dir():
        found = found_at(run_dir)
        what = f"{run_dir} is {found}, not a folder" if found else f"no folder {run_dir}"
        raise FileNotFoundError(f"cannot resume: {what}; give the --out folder of a "
                                "`handformer train` that stopped")
    if not (run_dir / "config.json").exists():
        raise FileNotFoundError(f"cannot resume: {run_dir} has no config.json, so no training ran there; "
                                "give the --out folder of a `handformer train`")
    if not (run_dir / "checkpoint.safetensors").exists():
        raise FileNotFoundError(f"cannot resume: {run_dir} has no checkpoint.safetensors yet (training "
                                "stopped before its first one); start it again with --config and --out")
    saved = read_run_config(run_dir)
    run_model_config(run_dir, saved, Seq2SeqConfig if saved["task"] == "translation" else CausalLMConfig)
    job_dict = {k: v for k, v in saved.items() if k in ("task", "train", "data", "decode")}
    post = saved.get("post_training")
    if isinstance(post, dict):  # sft, dpo, grpo: the base stays needed (LoRA, the reference)
        job_dict["task"] = post.get("task")
        if post.get("settings"):
            job_dict[post.get("task")] = post["settings"]
        job_dict["model"] = {}
        return run_dir, apply_set(job_dict, args.set)
    job_dict["model"] = {k: v for k, v in saved["model"].items()  # sizes come from tokenizers
                         if k not in ("family", "src_vocab_size", "tgt_vocab_size", "vocab_size",
                                      "pad_id")}
    if saved.get("init_from", {}).get("lora") is False:  # a full fine-tune's checkpoint holds
        # every weight, so it resumes like any run, without reading its base run again
        job_dict["train"] = {k: v for k, v in job_dict["train"].items() if k != "init_from"}
    return run_dir, apply_set(job_dict, args.set)


def new_job(args: argparse.Namespace) -> tuple[Path, dict]:
    """The run directory and job of `train --config FILE --out RUN`."""
    if not args.config and not args.init_from:
        raise ValueError("give --config FILE.toml (or a built-in name), --init-from RUN_DIR "
                         "or --resume RUN_DIR")
    # --init-from alone: a language-model job on the defaults, changed with --set
    job_dict = job_from_args(args) if args.config else apply_set({"task": "lm"}, args.set)
    if args.init_from:
        job_dict.setdefault("train", {})["init_from"] = args.init_from
    run_dir = Path(args.out or DEFAULT_OUT)
    if (run_dir / "checkpoint.safetensors").exists() and not args.overwrite:
        raise ValueError(f"{run_dir} already holds a run; use --resume {run_dir} to "
                         "continue it, --overwrite to start over, or another --out")
    return run_dir, job_dict


def cmd_train(args: argparse.Namespace) -> int:
    from handformer.tasks.lm.finetune import ADAPTERS_FILE
    from handformer.tasks.lm.job import LMJob
    from handformer.tasks.lm.train import run_train_lm
    from handformer.tasks.post.job import POST_TASKS, PostJob
    from handformer.tasks.post.train import run_post
    from handformer.tasks.translation.job import TranslationJob
    from handformer.tasks.translation.train import run_train
    from handformer.training.distributed import env_rank
    from handformer.training.run_lock import run_lock
    from handformer.training.tensorboard import check_loggers

    run_dir, job_dict = resumed_job(args) if args.resume else new_job(args)
    if args.tokenizer:  # shards that carry none (llm.c, nanoGPT): the tokenizer they were made with
        job_dict.setdefault("data", {})["tokenizer"] = args.tokenizer
    task = job_dict.pop("task", "translation")
    if task == "translation" and ("init_from" in job_dict.get("train", {})
                                  or "lora" in job_dict.get("train", {})):
        raise ValueError("[train] init_from and [train.lora] fine-tune language models (task = \"lm\"); "
                         "a translation job trains from scratch")
    if task not in ("translation", "lm", *POST_TASKS):
        raise ValueError(f"unknown task {task!r} in the config; use translation, lm, "
                         f"{', '.join(POST_TASKS)}")
    try:
        if task in POST_TASKS:
            job = PostJob.from_dict({**job_dict, "task": task})
        else:
            job = (TranslationJob if task == "translation" else LMJob).from_dict(job_dict)
    except ValueError as err:  # a resumed run's config.json, or --config with --set
        raise ValueError(f"{run_dir / 'config.json'}: {err}" if args.resume else str(err)) from None
    check_loggers(job.train.log)  # before any data is read: tensorboard asked for and missing
    # One `handformer train` a run directory at a time (under torchrun, rank 0 holds the lock).
    with run_lock(run_dir, enabled=env_rank() == 0):
        run = {"translation": run_train, "lm": run_train_lm}.get(task, run_post)
        try:
            _, result = run(job, run_dir, resume=bool(args.resume))
        except KeyboardInterrupt:
            raise KeyboardInterrupt(interrupted_hint(run_dir)) from None
        if env_rank() != 0:  # under torchrun, rank 0 alone writes the plot and reports
            return 0
        from handformer.see.plots import plot_loss_curve

        curve = plot_loss_curve(run_dir)
    best = "n/a" if result.best_val_loss is None else f"{result.best_val_loss:.4f}"
    print(f"done: {result.step} steps in {result.elapsed_s:.0f} s, best val loss {best}")
    weights = ADAPTERS_FILE if (run_dir / ADAPTERS_FILE).is_file() else "model.safetensors"
    print(f"run directory: {run_dir} ({weights}, metrics.jsonl, {curve.name})")
    return 0


def interrupted_hint(run_dir: Path) -> str:
    """What a training run stopped by Ctrl-C left, and how to go on."""
    if (run_dir / "checkpoint.safetensors").is_file():
        return (f"{run_dir} holds whole files (each one is written aside, then renamed) and its last "
                f"checkpoint; go on with `handformer train --resume {run_dir}`")
    return f"training stopped before its first checkpoint in {run_dir}; start it again with the same command"


def cmd_demo(args: argparse.Namespace) -> int:
    import time

    from handformer.see.plots import plot_attention, plot_loss_curve
    from handformer.tasks.job_file import apply_overrides, load_job_file
    from handformer.tasks.translation.job import TranslationJob, load_pairs
    from handformer.tasks.translation.scores import corpus_scores
    from handformer.tasks.translation.train import run_train
    from handformer.tasks.translation.translator import Translator, attention_maps
    from handformer.training.run_lock import run_lock

    start = time.perf_counter()
    job = TranslationJob.from_dict(
        {k: v for k, v in apply_overrides(load_job_file("demo"), parse_overrides(args.set)).items()
         if k != "task"})
    run_dir = Path(args.out)
    print("handformer demo: teach a small Transformer to translate dates written in words into ISO "
          "dates\n(e.g. 'the twenty-third of march, nineteen ninety-seven' -> '1997-03-23').\n")
    with run_lock(run_dir):  # as `train`: one process a run directory
        run_train(job, run_dir)
    translator = Translator.load(run_dir)
    _, _, heldout = load_pairs(job.data)
    sources = [s for s, _ in heldout.pairs]
    refs = [t for _, t in heldout.pairs]
    hyps = translator.translate(sources)
    scores = corpus_scores(hyps, refs)
    print()
    print_table([(s, h, r, "yes" if h == r else "NO") for s, h, r in
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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train a small translator on the embedded dates task, in minutes")
    p.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    p.add_argument("--examples", type=positive_int, default=10, help="held-out examples to show")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the demo config, e.g. --set train.steps=300")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a model from a TOML config")
    p.add_argument("--config", help="TOML file, or a built-in config name (demo)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field: section.key=value, e.g. train.steps=500")
    p.add_argument("--out", default=None, help=f"run directory (default {DEFAULT_OUT})")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint")
    p.add_argument("--init-from", metavar="RUN_DIR",
                   help="fine-tune: start from this language-model run's weights, model and tokenizer "
                   "(sets train.init_from; add [train.lora] for LoRA)")
    p.add_argument("--overwrite", action="store_true", help="start over in an existing run directory")
    p.add_argument("--tokenizer", metavar="RUN_DIR|tokenizer.json",
                   help="language models on data.shards: the shards' tokenizer (= --set data.tokenizer=...)")
    p.set_defaults(func=cmd_train)
