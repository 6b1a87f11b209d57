"""Import a GGUF model file (llama.cpp's format) as a handformer language-model run.

    import_gguf("qwen2.5-0.5b-instruct-q8_0.gguf", "runs/qwen")
    # then: handformer generate runs/qwen --prompt "Once upon a time" --temperature 0

The architectures are gguf_arch.py's (llama, qwen2, gemma, phi3, gpt2); the file's settings that
handformer's model does not implement (experts, other rope scalings, soft-capping, ...) are
refused by key, before any weight is read. Every tensor is decoded to float32 by handformer's own
gguf_quants.py: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K (any other type is refused by
name), then mapped strictly: every GGUF tensor used, every model tensor filled, every shape equal.

From the tensors: the vocabulary size (token_embd's rows), a tied head (no output.weight), the
biases (present, or for GPT-2 all zero = none, as export-gguf writes a run without biases) and
Llama 3's rope scaling (rope_freqs.weight). The tokenizer (gguf_tokenizer.py), its special ids
and the chat template (written as chat_template.jinja, with the special-token strings in
tokenizer_config.json, as `handformer chat` reads them) come along.
import_gguf(export_gguf(run)) at f32 is the run again: the same weights, settings, tokenizer.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from handformer.config import CausalLMConfig
from handformer.convert.gguf_arch import (
    FAMILIES,
    GPT2,
    NOT_YET,
    Family,
    import_plan,
    read_hparams,
    read_rope_scaling,
    source_shape,
    split_tensor,
)
from handformer.convert.gguf_file import GGUFFile, check_types, read_gguf
from handformer.convert.gguf_tokenizer import special_tokens_from_gguf, tokenizer_from_gguf
from handformer.convert.hf_import import CHAT_FILES, ImportedLM, model_from_state
from handformer.io import atomic_write_text
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.run import save_lm_run

ROPE_FREQS = "rope_freqs.weight"


def _family(file: GGUFFile) -> Family:
    arch = file.architecture
    if arch in FAMILIES:
        return FAMILIES[arch]
    why = f": {NOT_YET[arch]}, which handformer's model does not do yet" if arch in NOT_YET else ""
    raise ValueError(f"{file.path} is a {arch!r} model{why}; import-gguf reads {', '.join(FAMILIES)}")


def _tensor(file: GGUFFile, name: str) -> Tensor:
    if name not in file.tensors:
        raise ValueError(f"{file.path} has no tensor {name}, which every {file.architecture} model has")
    return file.tensors[name].to_torch()


def _biases(file: GGUFFile, family: Family) -> tuple[dict[str, bool], set[str]]:
    """(bias settings, GGUF bias tensors that are all zero and so stand for none)."""
    if not family.biases:
        return {}, set()
    names = set(file.tensors)
    if not family.zero_biases:
        bias = "blk.0.attn_output.bias" in names or "blk.0.ffn_down.bias" in names
        qkv = not bias and "blk.0.attn_q.bias" in names
        return {"bias": bias, "qkv_bias": qkv}, set()
    zero = {n for n in names if n.endswith(".bias") and not _tensor(file, n).any()}
    every = {n for n in names if n.endswith(".bias")}
    qkv = {n for n in every if ".attn_qkv." in n}
    if every - qkv <= zero:  # no bias but (perhaps) the q/k/v ones
        return {"bias": False, "qkv_bias": not qkv <= zero}, (zero if qkv <= zero else zero - qkv)
    return {"bias": True, "qkv_bias": False}, set()


def config_from_gguf(file: GGUFFile, family: Family, notes: list[str]) -> tuple[CausalLMConfig, set[str]]:
    """The model's settings, and the zero bias tensors the config leaves out."""
    where = str(file.path)
    settings = read_hparams(file.metadata, family, where)
    embd = file.tensors.get("token_embd.weight")
    if embd is None or len(embd.shape) != 2:
        raise ValueError(f"{where} has no 2-D token_embd.weight; it is not a language model")
    biases, zeros = _biases(file, family)
    settings.update(biases, vocab_size=embd.shape[0])
    if not family.tied_only:
        settings["tie_embeddings"] = "output.weight" not in file.tensors
    preset = CausalLMConfig.gpt2_style if family is GPT2 else CausalLMConfig.llama_style
    try:
        cfg = preset(**settings)
        if family.rope_freqs and ROPE_FREQS in file.tensors:
            scaling = read_rope_scaling(file.metadata, _tensor(file, ROPE_FREQS), cfg, where)
            cfg = preset(**{**settings, "rope_scaling": scaling})
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None
    if zeros:
        notes.append(f"{len(zeros)} bias tensors are all zero: read as no biases (as export-gguf writes a "
                     "run without them)")
    return cfg, zeros


def _expected_shapes(cfg: CausalLMConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = CausalLM(cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def state_from_gguf(file: GGUFFile, cfg: CausalLMConfig, family: Family, zeros: set[str],
                    ) -> dict[str, Tensor]:
    """`CausalLM(cfg)`'s state dict from the file's tensors, strictly (one ValueError lists every
    missing, unexpected and wrong-shaped tensor)."""
    expected = _expected_shapes(cfg)
    plan = import_plan(cfg, family, expected)
    known = set(plan) | zeros | ({ROPE_FREQS} if family.rope_freqs else set())
    head = {"lm_head.weight"} if cfg.tie_embeddings else set()
    problems = {
        "missing tensors": [n for n in plan if n not in file.tensors],
        "unexpected tensors": [n for n in file.tensors if n not in known],
        "shape mismatches": [f"{n} is {file.tensors[n].shape}, expected {source_shape(keys, expected)}"
                             for n, keys in plan.items()
                             if n in file.tensors and file.tensors[n].shape != source_shape(keys, expected)],
        "model tensors no GGUF tensor fills": sorted(
            set(expected) - head - {k for ks in plan.values() for k in ks}),
    }
    lines = [f"{title} ({len(items)}): {', '.join(items[:8])}{' ...' if len(items) > 8 else ''}"
             for title, items in problems.items() if items]
    if lines:
        raise ValueError(f"{file.path} does not match handformer's {family.name} with {cfg.n_layers} "
                         f"layers: {'; '.join(lines)}")
    state: dict[str, Tensor] = {}
    for name, keys in plan.items():
        state.update(split_tensor(name, file.tensors[name].to_torch(), keys, cfg, family, expected))
    return state


def _chat_files(run_dir: Path, metadata: dict[str, Any], tokenizer: Any, tokens: Any) -> None:
    """chat_template.jinja and the special-token strings, when the file has a chat template (a run
    overwritten by a file without one loses the old run's)."""
    template = metadata.get("tokenizer.chat_template")
    if not isinstance(template, str) or not template.strip():
        for name in CHAT_FILES:
            (run_dir / name).unlink(missing_ok=True)
        return
    bos = tokens.bos_id if tokens.bos_id is not None else metadata.get("tokenizer.ggml.bos_token_id")
    names = {"bos_token": bos, "eos_token": tokens.eos_id, "unk_token": tokenizer.unk_id,
             "pad_token": tokens.pad_id}
    config = {name: tokenizer.hf.id_to_token(i) for name, i in names.items()
              if isinstance(i, int) and tokenizer.hf.id_to_token(i) is not None}
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "chat_template.jinja", template)
    atomic_write_text(run_dir / "tokenizer_config.json", json.dumps(config, indent=2) + "\n")


def import_gguf(path: str | os.PathLike, run_dir: str | os.PathLike, overwrite: bool = False,
                ) -> ImportedLM:
    """Convert the GGUF file at `path` into a run directory. Nothing is written unless every
    check passes."""
    path, run_dir = Path(path), Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{run_dir} is a file; give a directory for the run")
    if (run_dir / "config.json").exists() and not overwrite:
        raise ValueError(f"{run_dir} already holds a run; choose another directory or pass --overwrite")
    file = read_gguf(path)
    family = _family(file)
    check_types(file)
    notes: list[str] = []
    cfg, zeros = config_from_gguf(file, family, notes)
    tokenizer = tokenizer_from_gguf(file.metadata, cfg.vocab_size, str(path))
    tokens = special_tokens_from_gguf(file.metadata, cfg.vocab_size, notes)
    model = model_from_state(cfg, state_from_gguf(file, cfg, family, zeros))
    types = Counter(t.type_name for t in file.tensors.values())
    source = {"gguf": str(path.resolve()), "architecture": family.arch, "model_type": family.model_type,
              "tensor_types": dict(sorted(types.items())), "notes": notes}
    _chat_files(run_dir, file.metadata, tokenizer, tokens)
    save_lm_run(run_dir, model, tokenizer, tokens, source=source)
    return ImportedLM(run_dir, family.arch, f"GGUF {family.name}", model.num_parameters(), cfg.n_layers,
                      cfg.vocab_size, tokens, notes)


__all__ = ["config_from_gguf", "import_gguf", "state_from_gguf"]
