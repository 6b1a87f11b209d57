"""check compares in float64. A learner's cast to float32 (`x.float()`, `x.to(torch.float32)`: Meta's
and Hugging Face's norms and softmax, written so for half-precision weights) keeps a float64 tensor
in float64 while check runs, so that float32 rounding (~1e-7, grown through a block) is never taken
for a mistake. A float32 tensor (the tutorial-size shape check) is cast as written."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

NARROWED = (torch.float64, torch.float32)  # (the tensor's dtype, the cast's): kept in float64


@contextlib.contextmanager
def float64_kept() -> Iterator[None]:
    """`Tensor.float` and `Tensor.to` keep float64 while the block runs, then are put back."""
    to = Tensor.to

    def kept_to(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        out = to(self, *args, **kwargs)
        return to(self, device=out.device) if (self.dtype, out.dtype) == NARROWED else out

    float_ = Tensor.float
    Tensor.float = lambda self, *args, **kwargs: kept_to(self, torch.float32, *args, **kwargs)  # type: ignore[method-assign]
    Tensor.to = kept_to  # type: ignore[method-assign]
    try:
        yield
    finally:
        Tensor.float, Tensor.to = float_, to  # type: ignore[method-assign]
