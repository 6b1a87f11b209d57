"""Quantized language-model runs: `handformer quantize RUN_DIR OUT_DIR --int8` (or `--int4`, `--bf16`).

A quantized run is an ordinary run directory (tasks/lm/run.py) whose config.json carries one more
section, and whose model.safetensors holds the quantized tensors:

    "quantization": {"weights": "int8", "head": true, "kernel": "int8pack-bf16", "source_run": "..."}

- int8: every linear layer (attention q/k/v/o, the FFN, and the output head unless `head` is
  false) becomes `handformer.inference.quant.Int8Linear`: `<layer>.weight` int8 (N, K) and
  `<layer>.scales` float32 (N,); biases, norms and the token (and position) embeddings stay float32.
- int4: the same layers become `handformer.inference.quant_int4.Int4Linear` (`weight` packed 4-bit, with
  `scales` and `zeros` per group of `group_size` inputs); a layer whose input width is not a
  multiple of the group size is quantized to int8 instead.
- bf16: every floating-point tensor is stored and run in bfloat16.

`load_lm` reads the section and builds the matching model, so `generate` and `eval` take quantized
runs as they are.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from handformer.inference.quant import quantize_linears
from handformer.inference.quant_int4 import check_group_size
from handformer.io import atomic_write_bytes
from handformer.tasks.lm.quantization import FORMATS, HEAD, Quantization
from handformer.tasks.lm.run import load_lm, save_lm_run
from handformer.tasks.run_config import RunDir


def native_bf16(cpuinfo: str | None = None) -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16), and a sentence saying so.
    `cpuinfo`: the text of /proc/cpuinfo (read when not given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    match = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    found = sorted(set(match.group(1).split() if match else ()) & {"avx512_bf16", "amx_bf16"})
    if found:
        return True, f"this CPU has native bf16 ({', '.join(found)})"
    return False, ("this CPU has no native bf16 (no AVX512-BF16 or AMX-BF16 flag): bf16 matmuls are "
                   "emulated in fp32 arithmetic, so they only halve the bytes read and are usually "
                   "slower than fp32; prefer --int8")


def quantize_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike, weights: str = "int8",
                 head: bool = True, overwrite: bool = False, group_size: int = 32,
                 ) -> tuple[list[str], Quantization]:
    """Write a quantized copy of the language-model run in `run_dir` to `out_dir`.
    Returns the names of the quantized layers (int8) and the spec written to config.json."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if weights not in FORMATS:
        raise ValueError(f"quantization format {weights!r} is unknown; use --int8, --int4 or --bf16")
    if weights == "int4":
        check_group_size(group_size)
    if out_dir.exists() and out_dir.resolve() == run_dir.resolve():
        raise ValueError(f"OUT_DIR must differ from RUN_DIR {run_dir}: the float run stays as it is")
    if (out_dir / "config.json").exists() and not overwrite:
        raise ValueError(f"{out_dir} already holds a run; choose another directory or pass --overwrite")
    source = RunDir.read(run_dir)  # read once: refused from config.json alone, then loaded
    config = source.config
    if "lora" in config:
        raise ValueError(f"{run_dir} holds LoRA adapters on a base run; fold them in first with "
                         f"`handformer merge {run_dir} MERGED` and quantize MERGED")
    if "quantization" in config:
        raise ValueError(f"{run_dir} is already quantized ({config['quantization']}); quantize "
                         "the float run it came from")
    run = load_lm(source)
    spec = Quantization(weights, head, group_size=group_size)
    names: list[str] = []
    model = run.model
    if weights == "bf16":
        model = model.to(torch.bfloat16)
    else:
        names = quantize_linears(model, skip=() if head else (HEAD,), kernel=spec.kernel,
                                 bits=4 if weights == "int4" else 8, group_size=group_size)
    sections = {k: v for k, v in run.config.items() if k not in ("task", "model", "tokens")}
    sections["quantization"] = {**spec.__dict__, "source_run": str(run_dir.resolve())}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_lm_run(out_dir, model, run.tokenizer, run.tokens, **sections)
    if (run_dir / "metrics.jsonl").is_file():  # the training history, for reference
        atomic_write_bytes(out_dir / "metrics.jsonl", (run_dir / "metrics.jsonl").read_bytes())
    return names, spec


__all__ = ["native_bf16", "quantize_run"]
