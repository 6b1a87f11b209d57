"""A top-k of more than there are keeps them all. check runs a learner's code at its own small sizes:
a vocabulary of 24 where the code was written for thousands, a capacity factor set so high that no
token is dropped (discovery's FIXED). A constant written for the real sizes (a sampling loop's
`torch.topk(probs, 50)`, a routed block's `torch.topk(scores, int(capacity_factor * T))`) then asks
for more than the axis holds, and torch raises where the real run keeps the top 50 of thousands. While
check runs, a top-k called from the learner's file that asks for more than its axis holds takes the
whole axis, as `fixed_defaults` sets a loop's `top_k=50` to the vocabulary's size; any other top-k is
computed as written, and so is a k the calling function was handed as an argument (a filter's `top_k`:
a filter that does not bound it raises on k above the vocabulary, the catalogued top_k_exceeds_vocab)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from torch import Tensor

from handformer.check.core.precision import LEARNER


@contextlib.contextmanager
def whole_topk() -> Iterator[None]:
    """torch.topk and Tensor.topk, called from the learner's file, with k at most the axis's size;
    put back after it."""
    with mock.patch.object(torch, "topk", _bounded(torch.topk)), \
            mock.patch.object(Tensor, "topk", _bounded(Tensor.topk)):
        yield


def _bounded(topk: Callable[..., Any]) -> Callable[..., Any]:
    def call(values: Tensor, k: Any, dim: int = -1, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1)
        mine = caller.f_globals.get("__name__", "").startswith(LEARNER) and not _handed(caller, k)
        if mine and isinstance(values, Tensor) and isinstance(k, int) and values.dim():
            k = min(k, values.size(dim))
        return topk(values, k, dim, *args, **kwargs)

    return call


def _handed(frame: Any, k: Any) -> bool:
    """Whether `k` is the value of one of the arguments of the function running in `frame`."""
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return any(type(frame.f_locals.get(n)) is int and frame.f_locals[n] == k for n in names)
