"""A learner's file written for a GPU runs on this machine's CPU: where CUDA is not available,
`tensor.cuda()` and `module.cuda()` return the tensor or module as it is (Meta's Llama attention
builds its KV cache with `.cuda()`). What the code computes does not depend on the device."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def cuda_as_cpu() -> None:
    """Make `.cuda()` the identity for tensors and modules when CUDA is not available."""
    if torch.cuda.is_available():
        return

    def same(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self

    torch.Tensor.cuda = same  # type: ignore[method-assign]
    nn.Module.cuda = same  # type: ignore[method-assign]
