"""Export a language-model run as one GGUF file that llama.cpp (and the tools built on it) runs.

    export_gguf("runs/shakespeare_char_modern", "shakespeare.gguf", "q8_0")
    # then: llama-completion -m shakespeare.gguf -no-cnv -p "ROMEO:" -n 100 --temp 0

What goes in (gguf_arch.py has the architectures, gguf_tokenizer.py the vocabulary):
- the architecture the run's settings point to, as export-hf chooses it (an imported run goes
  back to its family): llama (also Mistral without a window, llama2.c models), qwen2, qwen3,
  qwen3moe, gemma, gemma2, gemma3, olmo2, smollm3, phi3 (also Phi-4-mini's partial RoPE and
  LongRoPE), gpt2, deepseek2 (DeepSeek-V3's latent attention and grouped experts); every
  setting the architecture cannot express is named in one ValueError;
- the tensors in llama.cpp's names and layouts, Llama 3's rope scaling as rope_freqs.weight and
  LongRoPE as rope_factors_short / rope_factors_long;
- the hyperparameters, the tokenizer with its special ids, the chat template, and the run's
  tokenizer.json.
A LoRA run is exported merged (W + B A * alpha / r). A quantized run is exported from its weights
as the model computes with them: int8 and int4 values times their scales (and zeros), bf16 as is.
A translation run (encoder-decoder) is refused: llama.cpp runs decoder-only models.

Tensor types (--type), as llama.cpp's convert_hf_to_gguf.py chooses them: f32 writes every tensor
in float32; f16, q8_0 and q4_0 write the matrices (embeddings, projections, the output head) in
float16, Q8_0 or Q4_0 and keep norms, biases, position embeddings and rope_freqs in float32. A
matrix whose rows are not a multiple of 32 long cannot be Q8_0 or Q4_0 and is written as float16
(noted). The blocks are made by handformer's own gguf_quants.quantize_q8_0 and quantize_q4_0 (the
same bytes as llama.cpp's reference quantizers; llama-quantize's Q4_0 would write the output head
in Q6_K, this writes every matrix in Q4_0). The file is written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from torch import Tensor

from handformer.config import CausalLMConfig, Llama3RopeScaling
from handformer.convert.gguf_arch import (
    Family,
    export_tensors,
    layer_values,
    longrope_tensors,
    mismatches,
    rope_factors,
    write_hparams,
)
from handformer.convert.gguf_file import write_gguf
from handformer.convert.gguf_quants import QK8_0, quantize_q4_0, quantize_q8_0
from handformer.convert.gguf_tokenizer import write_tokenizer

TYPES = ("f32", "f16", "q8_0", "q4_0")
_FILE_TYPES = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
               "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}
_BLOCKS = {"q8_0": (quantize_q8_0, gguf.GGMLQuantizationType.Q8_0),
           "q4_0": (quantize_q4_0, gguf.GGMLQuantizationType.Q4_0)}  # QK8_0 = QK4_0 = 32 weights a block


# --- the run's weights, as floats ------------------------------------------------------------------


# --- which tensor type each tensor gets ------------------------------------------------------------

def _stays_f32(name: str, tensor: Tensor) -> bool:
    """Norms, biases, 1-D tensors, position embeddings, a mixture's router and a convolution over
    positions stay float32 (as llama.cpp's converter keeps them)."""
    return (tensor.dim() <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight")
            or name.startswith("position_embd.") or name.endswith("ffn_gate_inp.weight")  # the router
            or name.endswith("ssm_conv1d.weight"))  # a state-space convolution (Qwen3.5's DeltaNet)


def encode(name: str, tensor: Tensor, type_name: str,
           ) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
    """(array for the writer, GGML type, or None for a float32 / float16 array) for one tensor."""
    if type_name == "f32" or _stays_f32(name, tensor):
        return tensor.to(torch.float32).numpy(), None
    if type_name in _BLOCKS and tensor.shape[-1] % QK8_0 == 0:
        quantize, ggml_type = _BLOCKS[type_name]
        return quantize(tensor).numpy(), ggml_type
    return tensor.to(torch.float16).numpy(), None  # f16, or blocks whose rows do not fit 32 a block


# --- checks ----------------------------------------------------------------------------------------


def _check_finite(tensors: list[tuple[str, Tensor]]) -> None:
    bad = [name for name, t in tensors if not torch.isfinite(t).all()]
    if bad:
        raise ValueError(f"the run's weights hold NaN or infinity in {', '.join(bad[:5])}; training "
                         "diverged: export an earlier run or train again with a lower learning rate")


def _family_notes(cfg: CausalLMConfig, family: Family, notes: list[str]) -> None:
    if cfg.dropout or cfg.attention_dropout:
        notes.append("dropout is left out (it acts only in training)")
    window = cfg.sliding_window
    if window is not None and window >= cfg.max_positions:
        notes.append(f"sliding_window={window} spans the whole context ({cfg.max_positions}): written "
                     "as none")
    elif window is not None and family.writes_window:
        notes.append(f"the sliding window ({window}) is written, but the pinned llama.cpp runs Phi-3 without "
                     f"it: its outputs agree with handformer's for sequences up to {window} tokens")
    if family.softcaps and (window is None or window >= cfg.max_positions):
        notes.append(f"llama.cpp's {family.name} always slides: the window is written as the whole context "
                     f"({cfg.max_positions}), which keeps every layer global up to that length")
    if family.longrope and cfg.rope_scaling is not None:
        original = getattr(cfg.rope_scaling, "original_max_positions", None)
        notes.append("llama.cpp turns to LongRoPE's long factors for every position when its context "
                     f"(n_ctx, rounded up to a multiple of 256) exceeds {original}; handformer and "
                     "transformers when the sequence does")
    notes += family.code.notes(cfg)
    if family.zero_biases and not cfg.bias:
        notes.append(f"the run has no biases (bias=false); llama.cpp's {family.name} needs them, so they are "
                     "written as zeros (the same function)")


# --- the export ------------------------------------------------------------------------------------


__all__ = ["TYPES", "write_model_gguf"]


def write_model_gguf(out: Path, state: dict[str, Tensor], cfg: CausalLMConfig, family: Family, tokenizer: Any,
                     tokens: Any, chat_template: str | None, type_name: str, model_name: str,
                     notes: list[str]) -> int:
    """Write a model (its float state dict, config, tokenizer and special tokens) as the GGUF file
    `out` in llama.cpp's layout for `family`; returns the number of tensors written."""
    problems = mismatches(cfg, family)
    if problems:
        raise ValueError(f"cannot export to llama.cpp's {family.name} ({family.arch!r}): "
                         + "; ".join(problems))
    _family_notes(cfg, family, notes)
    tensors = export_tensors(state, cfg, family)
    if isinstance(cfg.rope_scaling, Llama3RopeScaling):
        tensors.append(("rope_freqs.weight", rope_factors(cfg)))  # llama.cpp divides each frequency by it
    tensors += longrope_tensors(cfg)  # Phi-3.5 / Phi-4-mini: rope_factors_short and _long
    _check_finite(tensors)
    encoded = [(name, *encode(name, t, type_name)) for name, t in tensors]
    if type_name in _BLOCKS:
        wide = sorted({t.shape[-1] for name, t in tensors if not _stays_f32(name, t) and t.shape[-1] % QK8_0})
        if wide:
            notes.append(f"matrices with rows {', '.join(map(str, wide))} long (not a multiple of {QK8_0}) "
                         "are written as F16, as llama.cpp's converter does")
    tokenizer_json = tokenizer.hf.to_str(pretty=False)

    def add_metadata(writer: gguf.GGUFWriter) -> None:
        writer.add_name(model_name)
        writer.add_file_type(_FILE_TYPES[type_name])
        if type_name in _BLOCKS:
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        write_hparams(writer, cfg, family)
        for key, values in layer_values(state, cfg, family).items():  # Apertus's xIELU numbers
            writer.add_array(key, values)
        write_tokenizer(writer, tokenizer, tokenizer_json, tokens, cfg.vocab_size, chat_template, notes)

    write_gguf(out, family.arch, add_metadata, encoded)
    return len(encoded)
