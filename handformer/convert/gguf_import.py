"""Import a GGUF model file (llama.cpp's format) as a handformer language-model run.

    import_gguf("qwen2.5-0.5b-instruct-q8_0.gguf", "runs/qwen")
    # then: handformer generate runs/qwen --prompt "Once upon a time" --temperature 0

The architectures are gguf_arch.py's (llama, qwen2, qwen3, qwen3moe, gemma, gemma2, gemma3, olmo2,
smollm3, phi3, gpt2, deepseek2, ...); the file's settings that handformer's model does not implement (experts
outside Qwen3-MoE, other rope scalings, soft-capping outside Gemma 2, ...) are refused by key,
before any weight is read. Every tensor is decoded to float32 by handformer's own gguf_quants.py:
F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K (any other type is refused by name), then mapped
strictly: every GGUF tensor used, every model tensor filled, every shape equal.

From the tensors: the vocabulary size (token_embd's rows), a tied head (no output.weight), the
biases (present, or for GPT-2 all zero = none, as export-gguf writes a run without biases) and
Llama 3's rope scaling (rope_freqs.weight). The tokenizer (gguf_tokenizer.py), its special ids
and the chat template (written as chat_template.jinja, with the special-token strings in
tokenizer_config.json, as `handformer chat` reads them) come along.
import_gguf(export_gguf(run)) at f32 is the run again: the same weights, settings, tokenizer.

`q4_0_blocks` reads the file's Q4_0 matrices kept 4-bit instead (values 0..15 and a float16 scale
per 32 weights, split and reordered as the float tensors are), for an int4 run whose Int4Linear
layers compute with exactly the file's weights (tasks/lm/imports.py, `import-gguf --int4`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from handformer.config import CausalLMConfig
from handformer.convert.gguf_arch import (
    FAMILIES,
    FROM_HF,
    NOT_YET,
    Family,
    entry_of,
    import_plan,
    layer_value_keys,
    read_hparams,
    read_layer_values,
    read_longrope,
    read_rope_scaling,
    source_shape,
    split_tensor,
)
from handformer.convert.gguf_file import GGUFFile
from handformer.convert.gguf_quants import q4_0_to_int4
from handformer.families import build_causal_lm

ROPE_FREQS = "rope_freqs.weight"
LONGROPE = ("rope_factors_short.weight", "rope_factors_long.weight")


def family_of_file(file: GGUFFile) -> Family:
    arch = file.architecture
    found = entry_of(arch, bool(file.metadata.get(f"{arch}.expert_count")))  # Mixtral: Llama with experts
    if found is not None:
        return found
    why = f": {NOT_YET[arch]}, which import-gguf does not read yet" if arch in NOT_YET else ""
    if arch in FROM_HF:
        why += f" (`handformer import-hf` reads its Hugging Face checkpoint, model_type {FROM_HF[arch]!r})"
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
    preset = CausalLMConfig.gpt2_style if family.rope is None else CausalLMConfig.llama_style
    try:
        cfg = preset(**settings)
        if family.rope_freqs and ROPE_FREQS in file.tensors:
            scaling = read_rope_scaling(file.metadata, _tensor(file, ROPE_FREQS), cfg, where)
            cfg = preset(**{**settings, "rope_scaling": scaling})
        if family.longrope and any(name in file.tensors for name in LONGROPE):
            short, long = (_tensor(file, name) for name in LONGROPE)
            longrope = read_longrope(file.metadata, short, long, cfg, where)
            cfg = preset(**{**settings, "rope_scaling": longrope})
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None
    if zeros:
        notes.append(f"{len(zeros)} bias tensors are all zero: read as no biases (as export-gguf writes a "
                     "run without them)")
    return cfg, zeros


def _expected_shapes(cfg: CausalLMConfig, family: Family) -> dict[str, tuple[int, ...]]:
    """The shapes of the tensors the family's map names (the model's, through its code's `to_gguf`)."""
    with torch.device("meta"):
        state = family.code.to_gguf(dict(build_causal_lm(cfg).state_dict()), cfg)
    return {k: tuple(v.shape) for k, v in state.items()}


def state_from_gguf(file: GGUFFile, cfg: CausalLMConfig, family: Family, zeros: set[str],
                    ) -> dict[str, Tensor]:
    """`CausalLM(cfg)`'s state dict from the file's tensors, strictly (one ValueError lists every
    missing, unexpected and wrong-shaped tensor)."""
    expected = _expected_shapes(cfg, family)
    plan = import_plan(cfg, family, expected)
    known = (set(plan) | zeros | ({ROPE_FREQS} if family.rope_freqs else set())
             | (set(LONGROPE) if family.longrope else set()))
    head = {"lm_head.weight"} if cfg.tie_embeddings else set()
    head |= set(layer_value_keys(cfg, family))  # numbers the metadata holds (Apertus's xIELU)
    shapes = {n: source_shape(n, keys, expected, cfg, family) for n, keys in plan.items()}
    problems = {
        "missing tensors": [n for n in plan if n not in file.tensors],
        "unexpected tensors": [n for n in file.tensors if n not in known],
        "shape mismatches": [f"{n} is {file.tensors[n].shape}, expected {shapes[n]}" for n in plan
                             if n in file.tensors and file.tensors[n].shape != shapes[n]],
        "model tensors no GGUF tensor fills": sorted(
            set(expected) - head - {k for ks in plan.values() for k in ks}),
    }
    lines = [f"{title} ({len(items)}): {', '.join(items[:8])}{' ...' if len(items) > 8 else ''}"
             for title, items in problems.items() if items]
    if lines:
        raise ValueError(f"{file.path} does not match handformer's {family.name} with {cfg.n_layers} "
                         f"layers: {'; '.join(lines)}")
    state = read_layer_values(file.metadata, cfg, family, expected, str(file.path))  # in the metadata
    for name, keys in plan.items():
        state.update(split_tensor(name, file.tensors[name].to_torch(), keys, cfg, family, expected))
    return family.code.from_gguf(state, cfg)


def q4_0_blocks(file: GGUFFile, cfg: CausalLMConfig, family: Family) -> dict[str, tuple[Tensor, Tensor]]:
    """Model weight key -> ((N, K) uint8 values 0..15, (N, K / 32) float32 scales) for every
    matrix the file holds in Q4_0, in handformer's layout (the same split and row order as
    `state_from_gguf`'s float tensors). Call after `state_from_gguf` has checked the shapes."""
    expected = _expected_shapes(cfg, family)
    out: dict[str, tuple[Tensor, Tensor]] = {}
    for name, keys in import_plan(cfg, family, expected).items():
        tensor = file.tensors[name]
        if tensor.type_name != "Q4_0":
            continue
        q, scales = q4_0_to_int4(torch.from_numpy(np.array(tensor.raw)), tensor.shape)
        # both split and reorder along rows only, so the scales follow their values
        parts = zip(split_tensor(name, q, keys, cfg, family, expected).items(),
                    split_tensor(name, scales, keys, cfg, family, expected).values())
        out.update({key: (values, part_scales) for (key, values), part_scales in parts})
    return out


__all__ = ["config_from_gguf", "family_of_file", "q4_0_blocks", "state_from_gguf"]
