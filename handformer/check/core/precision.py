"""check compares in float64. A `.float()` written in the learner's file (Meta's norms and softmax,
`self._norm(x.float()).type_as(x)`, written so for half-precision weights) keeps a float64 tensor in
float64 while check runs, so that float32 rounding (~1e-7, grown through a block) is never taken for
a mistake. check's own casts, a float32 tensor (the tutorial-size shape check), and `.to(dtype)` (a
cast back to the working dtype, float32 in the shape check) are cast as written."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

LEARNER = "learner_"  # the name their file is imported under begins so (engine.learner_module_name)


@contextlib.contextmanager
def float64_kept() -> Iterator[None]:
    """`Tensor.float` called from the learner's file keeps float64 while the block runs; put back
    after it."""
    float_ = Tensor.float

    def kept(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        caller = sys._getframe(1).f_globals.get("__name__", "")[:len(LEARNER)]
        return self if (self.dtype, caller) == (torch.float64, LEARNER) else float_(self, *args, **kwargs)

    Tensor.float = kept  # type: ignore[method-assign]
    try:
        yield
    finally:
        Tensor.float = float_  # type: ignore[method-assign]
