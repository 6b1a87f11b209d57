"""check compares in float64. A `.float()` written in the forward of a learner's module that holds
float64 weights (Meta's norms and softmax, `self._norm(x.float()).type_as(x)`; Hugging Face's rotary
`self.inv_freq.float() @ position_ids.float()`, written so for half-precision weights) gives float64
while check runs, so that float32 rounding (~1e-7, grown through a block) is never taken for a
mistake. check's own casts, a float32 module (the tutorial-size shape check), a free function's
casts, and `.to(dtype)` are cast as written. A softmax the learner's code asks for in float32
(Hugging Face's eager attention, `F.softmax(scores, dim=-1, dtype=torch.float32)`, an upcast written
for half precision) of float64 scores stays in float64: cast down, the finfo(float64).min their masks
fill becomes -inf, and a row whose keys are all masked turns to NaN that no run of theirs ever sees."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
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
    softmax = F.softmax
    F.softmax = _upcast_kept(softmax)  # type: ignore[assignment]
    try:
        yield
    finally:
        Tensor.float = float_  # type: ignore[method-assign]
        F.softmax = softmax  # type: ignore[assignment]


def _upcast_kept(softmax: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`softmax` that, called from the learner's file on float64 input with dtype=torch.float32,
    keeps float64 (an upcast, never meant as a narrowing)."""

    def kept(x: Tensor, *args: Any, dtype: torch.dtype | None = None, **kwargs: Any) -> Tensor:
        caller = sys._getframe(1).f_globals.get("__name__", "")[:len(LEARNER)]
        narrowing = (x.dtype, dtype, caller) == (torch.float64, torch.float32, LEARNER)
        return softmax(x, *args, dtype=None if narrowing else dtype, **kwargs)

    return kept
