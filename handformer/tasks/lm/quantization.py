"""The "quantization" section of a quantized run's config.json, and the model layout it asks for:
what `handformer quantize` (tasks/lm/quantize.py) writes and loading a run (tasks/lm/run.py) reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from handformer.inference.quant import DEFAULT_KERNEL, KERNELS, quantize_linears
from handformer.inference.quant_int4 import check_group_size

FORMATS = ("int8", "int4", "bf16")
HEAD = "lm_head"


@dataclass
class Quantization:
    """The "quantization" section of a run's config.json."""

    weights: str  # "int8", "int4" or "bf16"
    head: bool = True  # int8 / int4: the output head is quantized too
    kernel: str = DEFAULT_KERNEL  # Int8Linear's kernel, see inference/quant.py
    group_size: int = 32  # int4: inputs per group (inference/quant_int4.py)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Quantization:
        if not isinstance(data, dict) or data.get("weights") not in FORMATS:
            raise ValueError(f"{where}: 'quantization' must be a table with weights = one of "
                             f"{', '.join(FORMATS)}; got {data!r}")
        kernel = data.get("kernel", DEFAULT_KERNEL)
        if kernel not in KERNELS:
            raise ValueError(f"{where}: quantization kernel {kernel!r} is unknown; use one of "
                             f"{', '.join(KERNELS)}")
        group_size = data.get("group_size", 32)
        if data["weights"] == "int4":
            check_group_size(group_size)
        return cls(data["weights"], bool(data.get("head", True)), kernel, group_size)

    def prepare(self, model: nn.Module) -> nn.Module:
        """Turn a freshly built float model into the layout the saved quantized weights fill."""
        if self.weights == "bf16":
            return model.to(torch.bfloat16)
        quantize_linears(model, skip=() if self.head else (HEAD,), kernel=self.kernel, empty=True,
                         bits=4 if self.weights == "int4" else 8, group_size=self.group_size)
        return model


__all__ = ["FORMATS", "HEAD", "Quantization"]
