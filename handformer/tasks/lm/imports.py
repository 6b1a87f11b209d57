"""Checkpoints of other projects made into language-model runs (tasks/lm/run.py): a Hugging Face
checkpoint directory (`import-hf`), a llama2.c checkpoint and tokenizer (`import-llama2c`) and a
GGUF file (`import-gguf`). The conversions themselves (config keys, weight names and layouts,
tokenizers, GGUF's tensors) are handformer/convert's; this module reads their inputs, checks them
all before writing anything, and writes the run directory."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from handformer.config import CausalLMConfig
from handformer.convert.gguf_file import check_types, read_gguf
from handformer.convert.gguf_import import config_from_gguf, family_of_file, q4_0_blocks, state_from_gguf
from handformer.convert.gguf_tokenizer import special_tokens_from_gguf, tokenizer_from_gguf
from handformer.convert.hf_fp8 import dequantize_fp8, fp8_blocks
from handformer.convert.hf_import import (
    CHAT_FILES,
    MappedFiles,
    architecture_of,
    model_from_state,
    read_hf_weights,
    read_json,
    special_tokens,
    text_config_of,
    text_weights_of,
    write_safetensors,
)
from handformer.convert.hf_weights import (
    HEAD,
    config_from_hf,
    convert_hf_state_dict,
)
from handformer.convert.llama2c_tokenizer import llama2c_tokenizer
from handformer.convert.llama2c_weights import read_llama2c
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.families.catalogue import SPECS
from handformer.io import atomic_write_bytes, atomic_write_text
from handformer.paths import found_at
from handformer.tasks.lm.run import save_lm_run, write_lm_run_config

BOS_ID, EOS_ID = 1, 2  # hard-wired in run.c


@dataclass
class ImportedLM:
    """What `import_hf` wrote: enough for a one-line summary without loading the run again."""

    run_dir: Path
    model_type: str  # a key of the catalogue (handformer/families/catalogue.py)
    architecture: str  # the Hugging Face class name
    n_parameters: int  # tied weights counted once
    n_layers: int
    vocab_size: int
    tokens: SpecialTokens
    notes: list[str] = field(default_factory=list)  # choices the checkpoint's files left open

    def summary(self) -> str:
        return (f"{self.architecture} ({self.model_type}): {self.n_parameters:,} parameters, "
                f"{self.n_layers} layers, vocab {self.vocab_size:,} -> {self.run_dir}")


def _check_paths(hf_dir: Path, run_dir: Path, overwrite: bool) -> None:
    if not hf_dir.is_dir():
        found = found_at(hf_dir)
        where = f" ({found} is there); give the folder that holds config.json and *.safetensors" \
            if found else ""
        raise FileNotFoundError(f"no Hugging Face checkpoint directory at {hf_dir}{where}"
                                f"{_other_importer(hf_dir)}")
    if not (hf_dir / "config.json").exists():
        raise FileNotFoundError(f"{hf_dir} has no config.json, so it is no Hugging Face checkpoint folder; "
                                "give the folder that holds config.json, tokenizer.json and *.safetensors "
                                "(e.g. `huggingface-cli download ORG/MODEL --local-dir DIR` writes one)"
                                f"{_other_importer(*hf_dir.glob('*.gguf'), *hf_dir.glob('*.bin'))}")
    if run_dir.resolve() == hf_dir.resolve():
        raise ValueError(f"the run directory must differ from the checkpoint directory {hf_dir}")
    if (run_dir / "config.json").exists() and not overwrite:
        raise ValueError(f"{run_dir} already holds a run; choose another directory or pass --overwrite")


def _other_importer(*files: Path) -> str:
    """A pointer to the importer of a GGUF or llama2.c file given where a checkpoint folder belongs."""
    if any(f.suffix == ".gguf" for f in files):
        return "; a .gguf file is read by `handformer import-gguf FILE.gguf RUN_DIR`"
    if any(f.suffix == ".bin" for f in files):
        return "; a llama2.c model.bin is read by `handformer import-llama2c MODEL.bin TOKENIZER.bin RUN_DIR`"
    return ""


def _text_model(hf_state: dict[str, Any], cfg: CausalLMConfig) -> tuple[dict[str, Any], CausalLMConfig]:
    """A multimodal checkpoint's text-model tensors, and its config tied as the file says: a
    wrapper's config.json and its text_config may disagree, a tied head is not in the file."""
    state = text_weights_of(hf_state)
    if cfg.tie_embeddings == ("lm_head.weight" in state):
        cfg = replace(cfg, tie_embeddings=not cfg.tie_embeddings)
    return state, cfg


def import_hf(hf_dir: str | os.PathLike, run_dir: str | os.PathLike, overwrite: bool = False) -> ImportedLM:
    """Convert the checkpoint in `hf_dir` (model_type one of ARCHITECTURES) into a run directory
    (tasks/lm/run.py). Nothing is written unless every check passes."""
    hf_dir, run_dir = Path(hf_dir), Path(run_dir)
    _check_paths(hf_dir, run_dir, overwrite)
    config_path = hf_dir / "config.json"
    hf_config, wrapped = text_config_of(read_json(config_path, required=True), config_path)
    model_type, architecture = architecture_of(hf_config, hf_dir / "config.json")
    try:
        cfg = config_from_hf(hf_config)
        # FP8 weights with block scales are read, MXFP4 by a family whose map has it; others refused
        blocks = fp8_blocks(hf_config, mxfp4=bool(SPECS[model_type].tensors.mxfp4))
    except (ValueError, TypeError, KeyError) as err:  # a field missing or of the wrong type
        raise ValueError(f"{hf_dir / 'config.json'}: {err}") from None
    tokenizer = Tokenizer.load(hf_dir / "tokenizer.json")  # checked before the (big) weights
    notes: list[str] = []
    if tokenizer.vocab_size > cfg.vocab_size:
        notes.append(f"the tokenizer has {tokenizer.vocab_size} ids but the model only "
                     f"{cfg.vocab_size}; ids from {cfg.vocab_size} on cannot be fed to the model")
    tokens, eos_ids = special_tokens(hf_dir, hf_config, tokenizer, cfg.vocab_size, notes)

    files = MappedFiles()
    hf_state, weights = read_hf_weights(hf_dir, files)
    if wrapped is not None:
        hf_state, cfg = _text_model(hf_state, cfg)
        notes.append(wrapped)
    if blocks is not None:
        hf_state = dequantize_fp8(hf_state, blocks)
        notes.append(f"the FP8 (e4m3) weights with {blocks[0]} x {blocks[1]} block scales were dequantized "
                     "to bfloat16")
    state = convert_hf_state_dict(hf_state, cfg, model_type)  # views of the mapped files
    del hf_state
    if cfg.tie_embeddings:
        del state[HEAD]  # the embedding, stored once (as save_weights stores a tied model)
    source = {"hf_dir": str(hf_dir.resolve()), "model_type": model_type, "architecture": architecture,
              "weights": weights, "eos_ids": eos_ids, "notes": notes}
    run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(run_dir / "tokenizer.json")
    write_safetensors(run_dir / "model.safetensors", state, release=files.release)  # tensor by tensor
    write_lm_run_config(run_dir, cfg, tokens, source=source)  # last: the run is complete
    for name in CHAT_FILES:
        if (hf_dir / name).is_file():
            atomic_write_bytes(run_dir / name, (hf_dir / name).read_bytes())
    n_parameters = sum(t.numel() for t in state.values())
    return ImportedLM(run_dir, model_type, architecture, n_parameters, cfg.n_layers, cfg.vocab_size,
                      tokens, notes)


def import_llama2c(model_path: str | os.PathLike, tokenizer_path: str | os.PathLike,
                   run_dir: str | os.PathLike, overwrite: bool = False) -> ImportedLM:
    """Convert llama2.c's `model_path` + `tokenizer_path` into a run directory (tasks/lm/run.py)."""
    model_path, tokenizer_path, run_dir = Path(model_path), Path(tokenizer_path), Path(run_dir)
    if (run_dir / "config.json").exists() and not overwrite:
        raise ValueError(f"{run_dir} already holds a run; choose another directory or pass --overwrite")
    header, state = read_llama2c(model_path)
    tokenizer = llama2c_tokenizer(tokenizer_path, header.vocab_size)  # both read before writing
    cfg = header.config()
    model = model_from_state(cfg, state)  # the file's tensors become its parameters: no random init
    notes = ["generation also stops at BOS (id 1), as llama2.c's run.c does: its TinyStories "
             "models begin every story with BOS"]
    tokens = SpecialTokens(bos_id=BOS_ID, eos_id=EOS_ID, pad_id=None, eos_ids=[EOS_ID, BOS_ID])
    source = {"llama2c_model": str(model_path.resolve()), "llama2c_tokenizer": str(tokenizer_path.resolve()),
              "format": header.format_name, "shared_classifier": header.shared_classifier, "notes": notes}
    save_lm_run(run_dir, model, tokenizer, tokens, source=source)
    return ImportedLM(run_dir, header.format_name, "Llama", model.num_parameters(), cfg.n_layers,
                      cfg.vocab_size, tokens, notes)


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


def keep_q4_0(model: Any, blocks: dict[str, tuple[Any, Any]], where: str) -> dict[str, Any]:
    """Turn `model`'s linear layers into Int4Linear (groups of 32) holding the file's Q4_0 values
    and scales as they are (zeros 0: w = d * (q - 8)); returns the run's "quantization" section.
    The output head may be another type (llama-quantize writes it in Q6_K): it then stays float."""
    from torch import nn

    from handformer.inference.quant import quantize_linears
    from handformer.inference.quant_int4 import Int4Linear, pack_nibbles
    from handformer.tasks.lm.quantization import HEAD

    if model.cfg.tie_embeddings and "embed.weight" in blocks:
        blocks = {**blocks, f"{HEAD}.weight": blocks["embed.weight"]}  # the head is the embedding
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    other = [name for name in linears if name != HEAD and f"{name}.weight" not in blocks]
    if other:
        listed = ", ".join(other[:4]) + (" ..." if len(other) > 4 else "")
        raise ValueError(f"{where}: --int4 keeps Q4_0 matrices 4-bit, but {len(other)} linear layers are "
                         f"another type in the file ({listed}); import without --int4 to read every tensor "
                         "as float32")
    head = f"{HEAD}.weight" in blocks
    biases = {name: m.bias for name, m in linears.items()}
    quantize_linears(model, skip=() if head else (HEAD,), bits=4, group_size=32, empty=True)
    for name, m in model.named_modules():
        if isinstance(m, Int4Linear):
            values, scales = blocks[f"{name}.weight"]
            m.weight.copy_(pack_nibbles(values))
            m.scales.copy_(scales)
            m.zeros.zero_()
            bias = biases[name]
            m.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
    return {"weights": "int4", "head": head, "group_size": 32}


def import_gguf(path: str | os.PathLike, run_dir: str | os.PathLike, overwrite: bool = False,
                int4: bool = False) -> ImportedLM:
    """Convert the GGUF file at `path` into a run directory. Nothing is written unless every
    check passes. `int4`: keep the file's Q4_0 matrices 4-bit (an int4 run, `keep_q4_0`) instead
    of reading them as float32."""
    path, run_dir = Path(path), Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{run_dir} is {found_at(run_dir)}; give a directory for the run")
    if (run_dir / "config.json").exists() and not overwrite:
        raise ValueError(f"{run_dir} already holds a run; choose another directory or pass --overwrite")
    file = read_gguf(path)
    family = family_of_file(file)
    check_types(file)
    notes: list[str] = []
    cfg, zeros = config_from_gguf(file, family, notes)
    tokenizer = tokenizer_from_gguf(file.metadata, cfg.vocab_size, str(path))
    tokens = special_tokens_from_gguf(file.metadata, cfg.vocab_size, notes)
    model = model_from_state(cfg, state_from_gguf(file, cfg, family, zeros))
    sections: dict[str, Any] = {}
    if int4:
        sections["quantization"] = keep_q4_0(model, q4_0_blocks(file, cfg, family), str(path))
        notes.append("the Q4_0 matrices are kept 4-bit (Int4Linear, groups of 32, the file's float16 "
                     "scales); the embedding table is read as float32")
    types = Counter(t.type_name for t in file.tensors.values())
    source = {"gguf": str(path.resolve()), "architecture": family.arch, "model_type": family.model_type,
              "tensor_types": dict(sorted(types.items())), "notes": notes}
    _chat_files(run_dir, file.metadata, tokenizer, tokens)
    save_lm_run(run_dir, model, tokenizer, tokens, source=source, **sections)
    return ImportedLM(run_dir, family.arch, f"GGUF {family.name}", model.num_parameters(), cfg.n_layers,
                      cfg.vocab_size, tokens, notes)
