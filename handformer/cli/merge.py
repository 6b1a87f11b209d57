"""`handformer merge`: fold a LoRA run's adapters into its base weights and write an ordinary run."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_merge(args: argparse.Namespace) -> int:
    from handformer.adapters.lora import merge_lora
    from handformer.tasks.lm.finetune import copy_chat_files
    from handformer.tasks.lm.run import load_lm, save_lm_run
    from handformer.tasks.run_config import RunDir

    run_dir, out = Path(args.run_dir), Path(args.out_dir)
    base = RunDir.read(run_dir)  # read once: its checks here, then load_lm
    config = base.config
    if "lora" not in config:
        raise ValueError(f"{run_dir} has no LoRA adapters to merge (its config.json has no \"lora\" "
                         "section): it is an ordinary run already, usable as it is")
    if out.resolve() == run_dir.resolve():
        raise ValueError("OUT_DIR must differ from RUN_DIR: the merged run is a new run directory")
    if (out / "model.safetensors").exists() and not args.overwrite:
        raise ValueError(f"{out} already holds a model; pass --overwrite to replace it, or another OUT_DIR")
    run = load_lm(base)  # the base's weights (hash checked) + the adapters
    merge_lora(run.model)
    sections = {k: config[k] for k in ("data", "source") if k in config}
    sections["merged_from"] = {"run": str(run_dir.resolve()), "init_from": config["init_from"],
                               "lora": config["lora"]}
    save_lm_run(out, run.model, run.tokenizer, run.tokens, **sections)
    copy_chat_files(run_dir, out)
    print(f"merged the adapters of {run_dir} into {config['init_from']['path']}'s weights -> {out} "
          f"({run.model.num_parameters():,} parameters)")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("merge", help="fold a LoRA run's adapters into plain weights (W + B A * alpha / "
                       "rank), as an ordinary run")
    p.add_argument("run_dir", help="a LoRA fine-tuning run")
    p.add_argument("out_dir", help="where to write the merged run")
    p.add_argument("--overwrite", action="store_true", help="replace a model already in OUT_DIR")
    p.set_defaults(func=cmd_merge)
