"""Loading a language-model run is one pipeline, read top to bottom.

    model     build_causal_lm(config.json's "model" section)  the right shapes, weights to come
    steps     config.json's "pipeline", in order, each {"step": NAME, "settings": {...}}:
      quantize   the layers the run's weights were quantized in (int8 / int4 / bf16; the
                 "quantization" section, tasks/lm/quantization.py): put in before the weights,
                 which are stored quantized
      weights    the weights: this run's own file ({"file": "model.safetensors"}), or the base
                 run the "init_from" section names (a LoRA run's; its hash checked)
      lora       adapters put in place (the "lora" section's LoRAConfig), then their file loaded
      prepare    for decoding only: projections fused, dropout removed, large weights packed
                 (inference/prepare.py); skipped when the run is loaded to train, merge, quantize
                 or export it
A step whose settings live in a section names it ({"section": "lora"}): each setting has one place.

Every writer of a run records its pipeline (`pipeline_for`: from the sections it writes); a run
written before runs recorded it loads with the pipeline its sections imply, the same steps.

    {"pipeline": [{"step": "weights", "settings": {"section": "init_from"}},
                  {"step": "lora", "settings": {"section": "lora", "file": "adapters.safetensors"}},
                  {"step": "prepare", "settings": {}}]}
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from handformer.adapters.lora import LoRAConfig, add_lora
from handformer.config import CausalLMConfig
from handformer.families import build_causal_lm
from handformer.inference.prepare import prepare_for_decoding
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.finetune import ADAPTERS_FILE, verified_base
from handformer.tasks.lm.quantization import Quantization
from handformer.tasks.run_config import FIX, run_model_config, weights_fix
from handformer.training.checkpoint import load_weights

WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
STEPS = ("quantize", "weights", "lora", "prepare")


def step(name: str, **settings: Any) -> dict[str, Any]:
    return {"step": name, "settings": settings}


def pipeline_for(sections: dict[str, Any]) -> list[dict[str, Any]]:
    """The pipeline a run with these config.json sections loads with: a LoRA run's base weights then
    its adapters; a quantized run's layers then its weights; any other run its weights."""
    if "lora" in sections:
        steps = [step("weights", section="init_from"), step("lora", section="lora", file=ADAPTERS_FILE)]
    elif "quantization" in sections:
        steps = [step("quantize", section="quantization"), step("weights", file=WEIGHTS_FILE)]
    else:
        steps = [step("weights", file=WEIGHTS_FILE)]
    return steps + [step("prepare")]


def read_pipeline(run_dir: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's recorded pipeline, checked; or the one its sections imply (a run written before)."""
    steps = config.get("pipeline")
    if steps is None:
        return pipeline_for(config)
    where = f"{run_dir / 'config.json'}: \"pipeline\""
    if not isinstance(steps, list) or not all(isinstance(s, dict) and isinstance(s.get("settings"), dict)
                                              for s in steps):
        raise ValueError(f"{where} must be a list of {{\"step\": NAME, \"settings\": {{...}}}}; {FIX}")
    unknown = [s.get("step") for s in steps if s.get("step") not in STEPS]
    if unknown:
        raise ValueError(f"{where} has unknown step(s) {unknown}; the steps are {', '.join(STEPS)}; {FIX}")
    if [s["step"] for s in steps].count("weights") != 1:
        raise ValueError(f"{where} must load weights exactly once; {FIX}")
    named = [s["settings"]["section"] for s in steps if "section" in s["settings"]]
    missing = [name for name in named if name not in config]
    if missing:
        raise ValueError(f"{where} names section(s) {missing} that config.json lacks; {FIX}")
    return steps


def settings_of(config: dict[str, Any], settings: dict[str, Any]) -> Any:
    """A step's settings: the section it names, or its own."""
    return config[settings["section"]] if "section" in settings else settings


def fix_for(run_dir: Path, config: dict[str, Any], name: str = WEIGHTS_FILE) -> str:
    """What to do about a lost or broken file `name` of this run (its weights by default)."""
    source = config.get("source") if isinstance(config.get("source"), dict) else {}
    quantized = config.get("quantization") if isinstance(config.get("quantization"), dict) else None
    if quantized is not None:
        return (f"quantize {quantized.get('source_run', 'the run it came from')} again (`handformer quantize "
                "SOURCE_RUN OUT_DIR ... --overwrite`)")
    if "lora" in config:
        return "fine-tune again (or `handformer train --resume` it, which rewrites the adapters)"
    if "llama2c_model" in source:
        return ("import the checkpoint again (`handformer import-llama2c MODEL.bin TOKENIZER.bin "
                "RUN_DIR --overwrite`)")
    if "gguf" in source:
        return "import the file again (`handformer import-gguf FILE.gguf RUN_DIR --overwrite`)"
    if "source" in config:
        return "import the checkpoint again (`handformer import-hf HF_DIR RUN_DIR --overwrite`)"
    if name == TOKENIZER_FILE:
        return ("train the run again: the tokenizer is written as training starts, and the weights know "
                "the ids of that tokenizer only")
    return weights_fix(run_dir)


def _quantize(model: nn.Module, run_dir: Path, config: dict[str, Any], settings: dict[str, Any]) -> nn.Module:
    return Quantization.from_dict(settings_of(config, settings), str(run_dir / "config.json")).prepare(model)


def _weights(model: nn.Module, run_dir: Path, config: dict[str, Any], settings: dict[str, Any]) -> nn.Module:
    if "section" in settings:  # a LoRA run's base, found next to the run or where it was, hash checked
        base = verified_base(run_dir, {"init_from": settings_of(config, settings)})
        load_weights(model, base / WEIGHTS_FILE)
    else:
        load_weights(model, run_dir / settings.get("file", WEIGHTS_FILE), fix_for(run_dir, config))
    return model


def _lora(model: nn.Module, run_dir: Path, config: dict[str, Any], settings: dict[str, Any]) -> nn.Module:
    add_lora(model, LoRAConfig.from_dict(settings_of(config, settings)))
    load_weights(model, run_dir / settings.get("file", ADAPTERS_FILE), fix_for(run_dir, config))
    return model


def _prepare(model: nn.Module, run_dir: Path, config: dict[str, Any], settings: dict[str, Any]) -> nn.Module:
    return prepare_for_decoding(model)


RUN_STEP: dict[str, Callable[[nn.Module, Path, dict[str, Any], dict[str, Any]], nn.Module]] = {
    "quantize": _quantize, "weights": _weights, "lora": _lora, "prepare": _prepare}


def files_needed(run_dir: Path, steps: list[dict[str, Any]]) -> list[str]:
    """The run's own files its pipeline reads (a LoRA base's are checked by its step)."""
    files = {"lora": ADAPTERS_FILE, "weights": WEIGHTS_FILE}
    own = [s for s in steps if s["step"] in files and "section" not in s["settings"] or s["step"] == "lora"]
    return [s["settings"].get("file", files[s["step"]]) for s in own]


def load_model(run_dir: str | os.PathLike, config: dict[str, Any], device: str | torch.device = "cpu",
               decoding: bool = False) -> CausalLM:
    """The run's model, its pipeline applied in order (the "prepare" step only when `decoding`),
    on `device`, in eval mode."""
    run_dir = Path(run_dir)
    steps = read_pipeline(run_dir, config)
    for name in files_needed(run_dir, steps):
        if not (run_dir / name).exists():
            raise FileNotFoundError(f"{run_dir} has no {name}; {fix_for(run_dir, config, name)}")
    model: nn.Module = build_causal_lm(run_model_config(run_dir, config, CausalLMConfig))
    for s in steps:
        if s["step"] == "prepare":
            model = model.to(device)  # packed weights are packed where they are
        if s["step"] != "prepare" or decoding:
            model = RUN_STEP[s["step"]](model, run_dir, config, s["settings"])
    return model.to(device).eval()


__all__ = ["STEPS", "WEIGHTS_FILE", "files_needed", "fix_for", "load_model", "pipeline_for", "read_pipeline",
           "settings_of", "step"]
