"""check compares in float64. A `.float()` written in the forward of a learner's module that holds
float64 weights (Meta's norms and softmax, `self._norm(x.float()).type_as(x)`; Hugging Face's rotary
`self.inv_freq.float() @ position_ids.float()`, written so for half-precision weights) gives float64
while check runs, so that float32 rounding (~1e-7, grown through a block) is never taken for a
mistake. check's own casts, a float32 module (the tutorial-size shape check), a free function's
casts, and `.to(dtype)` are cast as written."""

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
    """`Tensor.float` called from a float64 module of the learner's gives float64 while the block
    runs; put back after it."""
    float_ = Tensor.float

    def kept(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        frame = sys._getframe(1)
        owner = frame.f_locals.get("self")  # the module whose forward casts: float64 while compared
        held = {t.dtype for t in [*getattr(owner, "parameters", list)(), *getattr(owner, "buffers", list)()]}
        caller = frame.f_globals.get("__name__", "")[:len(LEARNER)]
        wide = (torch.float64 in held, caller) == (True, LEARNER)
        return self.double() if wide else float_(self, *args, **kwargs)

    Tensor.float = kept  # type: ignore[method-assign]
    try:
        yield
    finally:
        Tensor.float = float_  # type: ignore[method-assign]
