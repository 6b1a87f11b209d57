"""The language-model run directory: what `handformer train` (task "lm") and
`handformer import-hf` write, and what `handformer generate` loads.

    config.json         {"task": "lm", "model": CausalLMConfig fields, "tokens": {"bos_id", "eos_id",
                         "pad_id" (each an id or null), "eos_ids" (every id that ends generation)},
                         plus optional "train", "data", "source", and "quantization" (runs written
                         by `handformer quantize`); runs written before "eos_ids" existed load with
                         eos_ids = [eos_id]
    tokenizer.json      a Hugging Face `tokenizers` file
    model.safetensors   CausalLM weights under handformer's names (tied weights stored once)

A trained run also holds checkpoint.safetensors (resumable), metrics.jsonl and loss_curve.png.
A LoRA fine-tune holds adapters.safetensors instead of model.safetensors, and its config.json
points to its base run ("init_from", "lora"; see finetune.py): loading it loads base + adapters.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from handformer.adapters.lora import LoRAConfig
from handformer.config import CausalLMConfig
from handformer.data.tokenizer import Tokenizer
from handformer.families import build_causal_lm
from handformer.io import atomic_write_text
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.finetune import ADAPTERS_FILE, base_model, verified_base
from handformer.tasks.lm.quantization import Quantization
from handformer.tasks.run_config import read_run_config, run_model_config, weights_fix
from handformer.training.checkpoint import load_weights, save_weights


@dataclass
class SpecialTokens:
    bos_id: int | None = None  # prepended to prompts when set
    eos_id: int | None = None  # the checkpoint's main end-of-sequence id (None: none)
    pad_id: int | None = None  # fills the left of shorter prompts in a batch
    # Every id that ends generation, eos_id first: Llama 3 instruct lists three and ends a turn
    # with <|eot_id|>, not with its eos_token. Filled from eos_id when not given.
    eos_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("bos_id", "eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"tokens.{name} must be a token id (an integer >= 0) or null, got {value!r}")
        if not isinstance(self.eos_ids, (list, tuple)) or any(
                isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.eos_ids):
            raise ValueError("tokens.eos_ids must be a list of token ids (integers >= 0), "
                             f"got {self.eos_ids!r}")
        ids = ([self.eos_id] if self.eos_id is not None else []) + list(self.eos_ids)
        self.eos_ids = list(dict.fromkeys(ids))  # eos_id first, no repeats
        if self.eos_id is None and self.eos_ids:
            self.eos_id = self.eos_ids[0]

    @classmethod
    def from_dict(cls, data: Any) -> SpecialTokens:
        """config.json's "tokens" section; runs written before "eos_ids" existed have only eos_id."""
        if not isinstance(data, dict):
            raise ValueError(f"config.json's \"tokens\" must be an object, got {data!r}")
        unknown = sorted(set(data) - {"bos_id", "eos_id", "pad_id", "eos_ids"})
        if unknown:
            raise ValueError(f"config.json's \"tokens\" has unknown field(s) {', '.join(unknown)}; "
                             "expected bos_id, eos_id, pad_id, eos_ids")
        return cls(**data)


@dataclass
class LMRun:
    model: CausalLM
    tokenizer: Tokenizer
    tokens: SpecialTokens
    config: dict[str, Any]  # the whole config.json


def write_lm_run_config(run_dir: str | os.PathLike, model_cfg: CausalLMConfig, tokens: SpecialTokens,
                        **sections: Any) -> None:
    """Write config.json for a language-model run; extra sections (train, data, source) as given."""
    data = {"task": "lm", "model": model_cfg.to_dict(), "tokens": tokens.__dict__, **sections}
    atomic_write_text(Path(run_dir) / "config.json", json.dumps(data, indent=2) + "\n")


def save_lm_run(run_dir: str | os.PathLike, model: CausalLM, tokenizer: Tokenizer,
                tokens: SpecialTokens, **sections: Any) -> None:
    """A complete run directory: config.json, tokenizer.json and model.safetensors."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(run_dir / "tokenizer.json")
    save_weights(model, run_dir / "model.safetensors")
    write_lm_run_config(run_dir, model.cfg, tokens, **sections)


def load_lm(run_dir: str | os.PathLike, device: str | torch.device = "cpu") -> LMRun:
    """Load a language-model run directory for generation (model in eval mode)."""
    run_dir = Path(run_dir)
    config = read_run_config(run_dir)
    if config.get("task") != "lm":
        raise ValueError(f"{run_dir} holds a {config.get('task')!r} run, not a language model "
                         "(task 'lm'); use `handformer translate` for translation runs")
    weights = ADAPTERS_FILE if "lora" in config else "model.safetensors"
    for name in (weights, "tokenizer.json"):
        if not (run_dir / name).exists():
            raise FileNotFoundError(f"{run_dir} has no {name}")
    model_cfg = run_model_config(run_dir, config, CausalLMConfig)
    if "lora" in config:  # the base run's weights, checked, then the adapters on top
        model = base_model(model_cfg, verified_base(run_dir, config), LoRAConfig.from_dict(config["lora"]))
    else:
        model = build_causal_lm(model_cfg)
    if "quantization" in config:  # written by `handformer quantize` (tasks/lm/quantize.py)
        model = Quantization.from_dict(config["quantization"], str(run_dir / "config.json")).prepare(model)
    if "lora" in config:
        fix = "fine-tune again (or `handformer train --resume` it, which rewrites the adapters)"
    elif isinstance(config.get("source"), dict) and "llama2c_model" in config["source"]:
        fix = ("import the checkpoint again (`handformer import-llama2c MODEL.bin TOKENIZER.bin "
               "RUN_DIR --overwrite`)")
    elif "source" in config:
        fix = "import the checkpoint again (`handformer import-hf HF_DIR RUN_DIR --overwrite`)"
    else:
        fix = weights_fix(run_dir)
    load_weights(model, run_dir / weights, fix)
    tokens = SpecialTokens.from_dict(config.get("tokens", {}))
    return LMRun(model.to(device).eval(), Tokenizer.load(run_dir / "tokenizer.json"), tokens, config)
