"""Language-model runs (tasks/lm/run.py) written for other projects: a directory `transformers`
loads (`export-hf`) and a GGUF file llama.cpp runs (`export-gguf`). The run is read through its
pipeline (tasks/lm/pipeline.py); the conversions themselves are handformer/convert's."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from safetensors.torch import save as st_save
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors
from torch import Tensor

from handformer.convert.gguf_arch import (
    family_for,
)
from handformer.convert.gguf_export import TYPES, write_model_gguf
from handformer.convert.hf_export import (
    export_state_dict,
    hf_config,
    hf_mismatches,
    model_type_for,
    stored_dtype,
)
from handformer.convert.hf_import import ARCHITECTURES as HF_CLASSES
from handformer.convert.hf_import import CHAT_FILES, prepended_id
from handformer.families.catalogue import SPECS
from handformer.generation.chat_template import load_chat_template
from handformer.io import atomic_write_bytes, atomic_write_text, check_export_target
from handformer.paths import kind_of
from handformer.tasks.lm.run import LMRun, load_lm
from handformer.tasks.run_config import RunDir

_BASE_HOPS = 8  # fine-tunes of fine-tunes followed back to an imported run, at most this deep


@dataclass
class ExportedLM:
    out_dir: Path
    model_type: str  # a key of the catalogue (handformer/families/catalogue.py)
    architecture: str  # the Hugging Face class name
    notes: list[str] = field(default_factory=list)  # what the export chose that the run left open

    def summary(self) -> str:
        return f"{self.architecture} ({self.model_type}) -> {self.out_dir}"


def _base_run_dirs(run_dir: Path, config: dict[str, Any]) -> list[Path]:
    """Where the base run of a fine-tuned ("init_from") or merged ("merged_from") run may be."""
    info = config.get("init_from")
    if isinstance(info, dict) and info.get("path"):
        nearby = [run_dir / info["relative"]] if info.get("relative") else []  # moved along with the run
        return nearby + [Path(info["path"])]
    merged = config.get("merged_from")
    if isinstance(merged, dict) and isinstance(merged.get("init_from"), dict):
        return [Path(merged["init_from"]["path"])]
    return []


def recorded_model_type(run_dir: Path, config: dict[str, Any], notes: list[str]) -> str | None:
    """The model_type recorded at import, for this run or the base run it was fine-tuned from."""
    for _ in range(_BASE_HOPS):
        recorded = (config.get("source") or {}).get("model_type")
        candidates = _base_run_dirs(run_dir, config)
        if recorded is not None or not candidates:
            return recorded
        found = [p for p in candidates if (p / "config.json").is_file()]
        if not found:
            notes.append(f"the base run {candidates[-1]} is gone, so the architecture follows the settings")
            return None
        run_dir = found[0]
        try:
            config = json.loads((run_dir / "config.json").read_text())
        except (ValueError, UnicodeDecodeError):
            notes.append(f"the base run's {run_dir / 'config.json'} is unreadable, so the architecture "
                         "follows the settings")
            return None
    return None


def export_model_type(run: LMRun, run_dir: str | os.PathLike = ".", notes: list[str] | None = None) -> str:
    """The model_type this run exports to, or `ValueError` naming the settings that do not map."""
    cfg = run.model.cfg
    if "quantization" in run.config:
        raise ValueError(f"this run is quantized ({run.config['quantization'].get('weights')}); "
                         "export the float run it came from (its source_run)")
    if "lora" in run.config:
        raise ValueError("this run holds LoRA adapters on a base run; fold them in first with "
                         "`handformer merge RUN MERGED` and export MERGED")
    recorded = recorded_model_type(Path(run_dir), run.config, [] if notes is None else notes)
    if recorded is not None and recorded not in HF_CLASSES:
        raise ValueError(f"this run was imported from model_type {recorded!r}; export-hf writes "
                         f"{', '.join(HF_CLASSES)} only")
    model_type = recorded or model_type_for(cfg)
    problems = hf_mismatches(cfg, model_type)
    if problems:
        raise ValueError(f"cannot export to {HF_CLASSES[model_type]}: " + "; ".join(problems))
    return model_type


def _tokenizer_json(run: LMRun, run_dir: Path, notes: list[str]) -> bytes:
    """The run's tokenizer.json; where the run prompts with BOS but the tokenizer adds none (runs
    trained here, llama2.c imports), a post-processor that prepends it, so that the exported
    tokenizer encodes prompts as `handformer generate` feeds them."""
    raw = (run_dir / "tokenizer.json").read_bytes()
    bos = run.tokens.bos_id
    if bos is None or prepended_id(run.tokenizer) is not None:
        return raw
    hf = HFTokenizer.from_str(raw.decode("utf-8"))
    name = hf.id_to_token(bos)
    template = processors.TemplateProcessing(single=f"{name} $A", pair=f"{name} $A {name}:1 $B:1",
                                             special_tokens=[(name, bos)])
    hf.post_processor = template if hf.post_processor is None else processors.Sequence(
        [hf.post_processor, template])
    notes.append(f"the run starts prompts with BOS {name!r} (id {bos}); the exported tokenizer.json "
                 "prepends it, as `handformer generate` does")
    return hf.to_str(pretty=True).encode("utf-8")


def _token_files(run: LMRun, run_dir: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(ids for config.json, generation_config.json, tokenizer_config.json). Every id that stops
    generation in handformer (tokens.eos_ids: Llama 3's three, llama2.c's EOS and BOS) is an
    eos_token_id, so transformers' `generate` stops where handformer's does."""
    tokens = run.tokens
    eos = tokens.eos_ids[0] if len(tokens.eos_ids) == 1 else (tokens.eos_ids or None)
    ids = {"bos_token_id": tokens.bos_id, "eos_token_id": eos, "pad_token_id": tokens.pad_id}
    generation = {**ids, "_from_model_config": False}
    tok_config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "model_max_length": run.model.cfg.max_positions,
                                  "add_bos_token": tokens.bos_id is not None, "add_eos_token": False}
    for kind, token_id in (("bos", tokens.bos_id), ("eos", tokens.eos_id), ("pad", tokens.pad_id)):
        if token_id is not None:
            tok_config[f"{kind}_token"] = run.tokenizer.hf.id_to_token(token_id)
    imported = run_dir / "tokenizer_config.json"  # an imported checkpoint's: keep its chat template
    if imported.is_file():
        template = json.loads(imported.read_text()).get("chat_template")
        if template is not None:
            tok_config["chat_template"] = template
    return ids, generation, tok_config


def export_hf(run_dir: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False) -> ExportedLM:
    """Write the language-model run in `run_dir` as a Hugging Face directory `out_dir`."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    check_export_target(run_dir, out_dir, overwrite)
    run = load_lm(run_dir)
    notes: list[str] = []
    model_type = export_model_type(run, run_dir, notes)
    cfg = run.model.cfg
    spec = SPECS[model_type]
    if spec.tensors.zero_biases and not cfg.bias:
        notes.append(f"the run has no biases (bias=false); {spec.name} always has them, so they are "
                     "written as "
                     "zeros (the same function)")
    if not spec.residual_dropout and cfg.dropout:
        notes.append(f"{HF_CLASSES[model_type]} has no residual dropout; dropout={cfg.dropout} is left out "
                     "(training only)")
    ids, generation, tok_config = _token_files(run, run_dir)
    tokenizer_json = _tokenizer_json(run, run_dir, notes)
    dtype = stored_dtype(run_dir / "model.safetensors")
    tensors = {k: v.to(dtype) for k, v in export_state_dict(run.model.state_dict(), cfg, model_type).items()}
    config = {**hf_config(cfg, model_type, ids), "dtype": str(dtype).removeprefix("torch.")}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / "model.safetensors", st_save(tensors, metadata={"format": "pt"}))
    atomic_write_bytes(out_dir / "tokenizer.json", tokenizer_json)
    if (run_dir / CHAT_FILES[0]).is_file():  # chat_template.jinja, as the checkpoint had it
        atomic_write_bytes(out_dir / CHAT_FILES[0], (run_dir / CHAT_FILES[0]).read_bytes())
    for name, data in (("tokenizer_config.json", tok_config), ("generation_config.json", generation),
                       ("config.json", config)):  # config.json last: complete
        atomic_write_text(out_dir / name, json.dumps(data, indent=2) + "\n")
    return ExportedLM(out_dir, model_type, HF_CLASSES[model_type], notes)


@dataclass
class ExportedGGUF:
    path: Path
    arch: str  # general.architecture
    family: str  # for the summary: "Llama", "GPT-2", ...
    type_name: str  # "f32", "f16", "q8_0" or "q4_0"
    n_tensors: int
    n_bytes: int
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.family} ({self.arch}), {self.type_name}, {self.n_tensors} tensors, "
                f"{self.n_bytes / 1e6:.1f} MB -> {self.path}")


def float_state(run: LMRun, notes: list[str]) -> dict[str, Tensor]:
    """The model's state dict in floating point: LoRA adapters merged, int8 / int4 weights
    dequantized (what the quantized layers compute with), bf16 as stored."""
    model = run.model
    if "lora" in run.config:
        from handformer.adapters.lora import merge_lora

        merge_lora(model)
        notes.append("the LoRA adapters are merged into the base weights (W + B A * alpha / rank)")
    state = dict(model.state_dict())
    quantization = run.config.get("quantization")
    if quantization:
        from handformer.inference.quant import dequantize_int8
        from handformer.inference.quant_int4 import dequantize_int4, unpack_nibbles

        for key in [k for k in state if k.endswith(".scales")]:
            layer = key.removesuffix(".scales")
            weight, scales = state.pop(f"{layer}.weight"), state.pop(key)
            if f"{layer}.zeros" in state:
                zeros = state.pop(f"{layer}.zeros")
                state[f"{layer}.weight"] = dequantize_int4(unpack_nibbles(weight), scales, zeros)
            else:
                state[f"{layer}.weight"] = dequantize_int8(weight, scales)
        notes.append(f"the run is quantized ({quantization.get('weights')}); its weights are written as the "
                     "model computes with them (quantized values times their scales)")
    return state


def _check_paths(run_dir: Path, out: Path, overwrite: bool) -> RunDir:
    if out.is_dir():
        raise ValueError(f"{out} is a directory; give the GGUF file to write, e.g. {out / 'model.gguf'}")
    if (kind := kind_of(out)) is not None:  # a device or a pipe: --overwrite would rename a file over it
        raise ValueError(f"{out} is {kind}, not a file; give the path of the GGUF file to write")
    if out.exists() and not overwrite:
        raise ValueError(f"{out} exists; choose another file or pass --overwrite")
    run = RunDir.read(run_dir)
    if run.task == "translation":
        raise ValueError(f"{run_dir} is a translation run (an encoder-decoder Transformer); llama.cpp runs "
                         "decoder-only language models. `handformer export-hf` writes it as MarianMTModel")
    return run


def export_gguf(run_dir: str | os.PathLike, out: str | os.PathLike, type_name: str = "f32",
                overwrite: bool = False) -> ExportedGGUF:
    """Write the language-model run in `run_dir` as the GGUF file `out` (convert/gguf_export.py:
    what is written and how)."""
    run_dir, out = Path(run_dir), Path(out)
    if type_name not in TYPES:
        raise ValueError(f"--type {type_name!r} is unknown; choose one of {', '.join(TYPES)}")
    run = load_lm(_check_paths(run_dir, out, overwrite))
    notes: list[str] = []
    family = family_for(run.model.cfg, recorded_model_type(run_dir, run.config, notes))
    state = float_state(run, notes)
    template = load_chat_template(run_dir)
    count = write_model_gguf(out, state, run.model.cfg, family, run.tokenizer, run.tokens,
                             template.source if template else None, type_name, run_dir.resolve().name, notes)
    return ExportedGGUF(out, family.arch, family.name, type_name, count, out.stat().st_size, notes)
