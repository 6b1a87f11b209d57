"""The language-model run directory: what `handformer train` (task "lm") and
`handformer import-hf` write, and what `handformer generate` loads.

    config.json         {"task": "lm", "model": CausalLMConfig fields, "tokens": {"bos_id", "eos_id",
                         "pad_id" (each an id or null), "eos_ids" (every id that ends generation)},
                         plus optional "train", "data", "source", and "quantization" (runs written
                         by `handformer quantize`); runs written before "eos_ids" existed load with
                         eos_ids = [eos_id]; "pipeline": the steps that load it (pipeline.py)
    tokenizer.json      a Hugging Face `tokenizers` file
    model.safetensors   CausalLM weights under handformer's names (tied weights stored once)

A trained run also holds checkpoint.safetensors (resumable), metrics.jsonl and loss_curve.png.
A LoRA fine-tune holds adapters.safetensors instead of model.safetensors, and its config.json
points to its base run ("init_from", "lora"; see finetune.py): loading it loads base + adapters.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.io import atomic_write_text
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.pipeline import fix_for, load_model, pipeline_for
from handformer.tasks.run_config import RunDir
from handformer.training.checkpoint import save_weights


@dataclass
class LMRun:
    model: CausalLM
    tokenizer: Tokenizer
    tokens: SpecialTokens
    config: dict[str, Any]  # the whole config.json


def write_lm_run_config(run_dir: str | os.PathLike, model_cfg: CausalLMConfig, tokens: SpecialTokens,
                        **sections: Any) -> None:
    """Write config.json for a language-model run; extra sections (train, data, source) as given,
    and the pipeline that loads it (tasks/lm/pipeline.py)."""
    sections = {k: v for k, v in sections.items() if k != "pipeline"}  # a copied run's is not this one's
    data = {"task": "lm", "model": model_cfg.to_dict(), "tokens": tokens.__dict__, **sections,
            "pipeline": pipeline_for(sections)}
    atomic_write_text(Path(run_dir) / "config.json", json.dumps(data, indent=2) + "\n")


def save_lm_run(run_dir: str | os.PathLike, model: CausalLM, tokenizer: Tokenizer,
                tokens: SpecialTokens, **sections: Any) -> None:
    """A complete run directory: config.json, tokenizer.json and model.safetensors."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(run_dir / "tokenizer.json")
    save_weights(model, run_dir / "model.safetensors")
    write_lm_run_config(run_dir, model.cfg, tokens, **sections)


def load_lm(run_dir: str | os.PathLike | RunDir, device: str | torch.device = "cpu",
            decoding: bool = False) -> LMRun:
    """Load a language-model run directory (model in eval mode) through its pipeline
    (tasks/lm/pipeline.py); `decoding`: prepared for decoding too (fused, packed). A `RunDir`
    already read is not read again."""
    run = RunDir.read(run_dir)
    run_dir, config = run.path, run.config
    if config.get("task") != "lm":
        raise ValueError(f"{run_dir} holds a {config.get('task')!r} run, not a language model "
                         "(task 'lm'); use `handformer translate` for translation runs")
    if not (run_dir / "tokenizer.json").exists():
        fix = fix_for(run_dir, config, "tokenizer.json")
        raise FileNotFoundError(f"{run_dir} has no tokenizer.json; {fix}")
    try:  # before the (big) weights
        tokenizer = Tokenizer.load(run_dir / "tokenizer.json")
    except ValueError as err:
        raise ValueError(f"{err}; {fix_for(run_dir, config, 'tokenizer.json')}") from None
    model = load_model(run_dir, config, device, decoding)
    tokens = SpecialTokens.from_dict(config.get("tokens", {}))
    return LMRun(model, tokenizer, tokens, config)
