"""Fine-tuning: a language-model job that starts from a run (trained here or imported with
`handformer import-hf` or `import-llama2c`) instead of random weights, fully or with LoRA adapters
(`[train] init_from = "RUN_DIR"`, `[train.lora]`).

The job takes the base run's model config, weights, tokenizer and special tokens. A fine-tuned
run's config.json records where it came from:

    "init_from": {"path": the base run (absolute), "relative": the same path from this run,
                  "sha256": of the base's model.safetensors, "lora": true | false}
    "lora":      the LoRAConfig fields (LoRA runs only)

A LoRA run stores only its adapters, in adapters.safetensors. Loading it (`load_lm`) loads the
base run's weights, checks that their hash is still the recorded one, and adds the adapters.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from handformer.adapters.lora import LoRAConfig, add_lora, select_targets
from handformer.config import FAMILY_FIELDS, CausalLMConfig, setting_name
from handformer.data.tokenizer import Tokenizer
from handformer.families import build_causal_lm
from handformer.generation.chat_template import TEMPLATE_FILE, TOKENIZER_CONFIG
from handformer.io import atomic_write_bytes
from handformer.models.causal_lm import CausalLM
from handformer.tasks.run_config import RunDir
from handformer.training.checkpoint import load_weights

ADAPTERS_FILE = "adapters.safetensors"
# [model] fields a fine-tuning job may change: regularization, not architecture.
FREE_MODEL_FIELDS = ("dropout", "attention_dropout")


@dataclass
class BaseRun:
    run: RunDir  # the run directory and its config.json, read once
    model_cfg: CausalLMConfig

    @property
    def path(self) -> Path:  # resolved
        return self.run.path.resolve()

    @property
    def config(self) -> dict[str, Any]:
        return self.run.config


def read_base_run(init_from: str) -> BaseRun:
    """The run `[train] init_from` names, checked (config only; no weights are read)."""
    path = Path(init_from)
    where = f"[train] init_from={init_from!r}"
    if not path.is_dir():
        raise FileNotFoundError(f"{where}: no such run directory; give a run trained with `handformer "
                                "train` or imported with `handformer import-hf` or `import-llama2c`")
    try:
        run = RunDir.read(path)
        config = run.config
        if config["task"] != "lm":
            raise ValueError(f"it holds a {config['task']!r} run; fine-tuning starts from a "
                             "language-model run (task 'lm')")
        if "lora" in config:
            raise ValueError(f"it holds LoRA adapters, not a whole model; fold them in first with "
                             f"`handformer merge {init_from} OUT_DIR`, then set init_from = OUT_DIR")
        if "quantization" in config:
            source = config["quantization"].get("source_run", "the run it was quantized from")
            raise ValueError(f"it holds a model quantized to {config['quantization'].get('weights')}, whose "
                             f"weights cannot train; fine-tune the full-precision run ({source}) instead")
        model_cfg = run.model_config(CausalLMConfig)
    except (ValueError, FileNotFoundError) as err:
        raise type(err)(f"{where}: {err}") from None
    for name in ("model.safetensors", "tokenizer.json"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{where} has no {name}")
    return BaseRun(run, model_cfg)


def model_config_from_base(section: dict[str, tuple[Any, str | None]], base: BaseRun,
                           init_from: str) -> CausalLMConfig:
    """The base run's model config. `section`: what the job's [model] section says, field ->
    (value, the preset it came from or None). Every field must agree with the base except
    FREE_MODEL_FIELDS, which a fine-tuning job may change; a disagreement names the field."""
    fields = base.model_cfg.to_dict()
    CausalLMConfig.from_dict(_with(fields, {k: v for k, (v, _) in section.items()}), "model")  # unknown, bad
    for key, (value, preset) in section.items():
        ours = CausalLMConfig.from_dict(_with(fields, {key: value}), "model")
        if key not in FREE_MODEL_FIELDS and ours != base.model_cfg:
            origin = f" (from preset {preset!r})" if preset else ""
            theirs = fields.get(key, {}) if key == "family" or key in fields else getattr(base.model_cfg, key)
            raise ValueError(f"[model] {key}={value!r}{origin} disagrees with the run in [train] "
                             f"init_from ({init_from} has {setting_name(key)}={theirs!r}); a fine-tuning job "
                             f"keeps its base's architecture: remove [model] or make {key} agree")
    free = {k: v for k, (v, preset) in section.items() if k in FREE_MODEL_FIELDS and preset is None}
    return CausalLMConfig.from_dict({**fields, **free}, "model")


def _with(fields: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A saved model section with `changes` made; family settings given flat go into its section."""
    data = dict(fields)
    for key, value in changes.items():
        if key in FAMILY_FIELDS:
            data["family"] = {**data.get("family", {}), key: value}
        else:
            data[key] = value
    return data


def check_lora_targets(model_cfg: CausalLMConfig, lora: LoRAConfig) -> None:
    """Target names and ranks checked on a model without memory (meta device), before any work."""
    with torch.device("meta"):
        select_targets(build_causal_lm(model_cfg), lora)


def weights_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def provenance(base: BaseRun, run_dir: str | os.PathLike, lora: bool) -> dict[str, Any]:
    """What a fine-tuned run's config.json records under "init_from"."""
    return {"path": str(base.path), "relative": os.path.relpath(base.path, Path(run_dir).resolve()),
            "sha256": weights_sha256(base.path / "model.safetensors"), "lora": lora}


def verified_base(run_dir: str | os.PathLike, config: dict[str, Any]) -> Path:
    """The base run of a LoRA run, found (next to the run as recorded, else at its absolute path)
    and checked: its weights must hash to what the adapters were trained on."""
    run_dir = Path(run_dir)
    info = config["init_from"]
    found = [p for p in (run_dir / info["relative"], Path(info["path"]))
             if (p / "model.safetensors").is_file()]
    if not found:
        raise FileNotFoundError(f"{run_dir} holds LoRA adapters for the base run {info['path']}, "
                                "which has no model.safetensors any more; restore the base run there")
    digest = weights_sha256(found[0] / "model.safetensors")
    if digest != info["sha256"]:
        raise ValueError(f"the base run {found[0]} has changed since {run_dir}'s adapters were trained "
                         f"on it (sha256 of its model.safetensors is {digest[:16]}..., the adapters "
                         f"recorded {info['sha256'][:16]}...); adapters only fit the weights they "
                         "were trained on: restore the base run or fine-tune again")
    return found[0]


def copy_chat_files(source: Path, run_dir: Path) -> None:
    """The chat template files of `source` (an imported instruction-tuned model has them), copied
    into `run_dir`: a run fine-tuned or merged from it chats as its base did."""
    for name in (TEMPLATE_FILE, TOKENIZER_CONFIG):
        if (source / name).is_file():
            atomic_write_bytes(run_dir / name, (source / name).read_bytes())


def base_model(model_cfg: CausalLMConfig, base_dir: Path, lora: LoRAConfig | None) -> CausalLM:
    """The model a fine-tuning job starts from: the base run's weights, plus fresh adapters (B = 0)
    with everything else frozen when `lora` is given."""
    model = build_causal_lm(model_cfg)
    load_weights(model, base_dir / "model.safetensors")
    if lora is not None:
        add_lora(model, lora)
    return model


def unknown_token_warning(tokenizer: Tokenizer, ids: torch.Tensor, text: str, source: str) -> str | None:
    """A warning naming how many of `ids` (the encoded `text`) are the tokenizer's unknown token,
    with examples of the characters behind them; None when there are none."""
    if tokenizer.unk_id is None:
        return None
    count = int((ids == tokenizer.unk_id).sum())
    if not count:
        return None
    unknown = [c for c in sorted(set(text)) if tokenizer.unk_id in tokenizer.encode(c)]
    examples = ", ".join(repr(c) for c in unknown[:10]) + (", ..." if len(unknown) > 10 else "")
    return (f"warning: the base run's tokenizer encodes {count:,} of the {len(ids):,} {source} tokens "
            f"as unknown (<unk>), from {len(unknown)} character(s) it never saw: {examples}; they all "
            "become <unk> (clean the text, or start from a run whose tokenizer covers it)")
