"""check compares in float64. A cast to float32 written in the learner's file (`x.float()`,
`x.to(torch.float32)`: Meta's and Hugging Face's norms and softmax, written so for half-precision
weights) keeps a float64 tensor in float64 while check runs, so that float32 rounding (~1e-7, grown
through a block) is never taken for a mistake. check's own casts, and a float32 tensor (the
tutorial-size shape check), are cast as written."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

NARROWED = (torch.float64, torch.float32)  # (the tensor's dtype, the cast's): kept in float64
LEARNER = "learner_"  # the name their file is imported under begins so (engine.learner_module_name)


@contextlib.contextmanager
def float64_kept() -> Iterator[None]:
    """`Tensor.float` and `Tensor.to` called from the learner's file keep float64 while the block
    runs; both are put back after it."""
    to, float_ = Tensor.to, Tensor.float

    def cast(self: Tensor, depth: int, *args: Any, **kwargs: Any) -> Tensor:
        out = to(self, *args, **kwargs)
        caller = sys._getframe(depth).f_globals.get("__name__", "")
        theirs = (self.dtype, out.dtype) == NARROWED and caller.startswith(LEARNER)
        return to(self, device=out.device) if theirs else out

    Tensor.to = lambda self, *args, **kwargs: cast(self, 2, *args, **kwargs)  # type: ignore[method-assign]
    Tensor.float = lambda self, *args, **kwargs: cast(self, 2, torch.float32, *args, **kwargs)  # type: ignore
    try:
        yield
    finally:
        Tensor.to, Tensor.float = to, float_  # type: ignore[method-assign]
