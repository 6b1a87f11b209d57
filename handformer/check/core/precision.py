"""check compares in float64. A `.float()` or `.to(torch.float32)` written in the forward of a
learner's module that holds float64 weights (Meta's norms and softmax, `self._norm(x.float()).type_as(x)`;
Hugging Face's and CS336's norms, `x.to(torch.float32)`; Hugging Face's rotary
`self.inv_freq.float() @ position_ids.float()`, written so for half-precision weights) gives float64
while check runs, so that float32 rounding (~1e-7, grown through a block) is never taken for a
mistake (nor a mistake's output, large where it divides by a mean square, missed). check's own casts,
a float32 module (the tutorial-size shape check), a free function's casts, and `.to` another dtype are
cast as written. A softmax the learner's code asks for in float32
(Hugging Face's eager attention, `F.softmax(scores, dim=-1, dtype=torch.float32)`, an upcast written
for half precision) of float64 scores stays in float64: cast down, the finfo(float64).min their masks
fill becomes -inf, and a row whose keys are all masked turns to NaN that no run of theirs ever sees;
so for each door to it (`torch.softmax(s, -1, dtype=...)`, `s.softmax(-1, dtype=...)`) and the
log-softmax's. A float mask their code builds stays float32 (`torch.full((T, T), float("-inf"))`,
`nn.Transformer.generate_square_subsequent_mask(T)`): handed to a float64 attention,
`F.scaled_dot_product_attention` gives wrong numbers from 16 keys on (torch 2.x on the CPU), and
nn.MultiheadAttention's weights path raises; neither happens in the float32 the code is written for,
so while check runs such a mask reaches a float64 attention as float64."""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import sys
from collections.abc import Callable, Iterator
from operator import attrgetter
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

# what torch raises where float64 meets a float32 (or half) tensor in one operation
DTYPE_MISMATCH = re.compile(r"expected scalar type (Double|Float|Half) but found (Float|Double|Half)|"
                            r"(Double|Float) and (Float|Double)|same dtype")
LEARNER = "learner_"  # the name their file is imported under begins so (engine.learner_module_name)


@contextlib.contextmanager
def float64_kept() -> Iterator[None]:
    """`Tensor.float` and `.to(torch.float32)` called from a float64 module of the learner's give
    float64, and their float32 softmaxes of float64 scores stay float64, while the block runs; put
    back after it."""
    kept = {(Tensor, "float"): _float_kept, (Tensor, "to"): _to_kept, (torch, "full"): _full_kept,
            (Tensor, "masked_fill"): _masked_fill_kept,
            **dict.fromkeys(itertools.product((F, torch, Tensor), ("softmax", "log_softmax")), _upcast_kept),
            (F, "scaled_dot_product_attention"): lambda sdpa: _masks_cast(sdpa, {3, "attn_mask"}),
            (F, "multi_head_attention_forward"): lambda f: _masks_cast(f, {"attn_mask", "key_padding_mask"})}
    held = [(owner, name, getattr(owner, name)) for owner, name in kept]
    _put([(owner, name, kept[owner, name](original)) for owner, name, original in held])
    try:
        yield
    finally:
        _put(held)


def _as_query(mask: Any, query: Tensor) -> Any:
    """A float mask in the query's dtype when the query is float64; any other mask as it is."""
    if isinstance(mask, Tensor) and mask.is_floating_point() and query.dtype == torch.float64:
        return mask.to(query.dtype)
    return mask


def _masks_cast(fn: Callable[..., Any], masks: set[int | str]) -> Callable[..., Any]:
    """fn with its mask arguments (by position after the query, 1 the first, or by name) in its query's
    dtype (nn.MultiheadAttention calls F.multi_head_attention_forward, which calls the fused attention)."""

    def call(query: Tensor, *args: Any, **kwargs: Any) -> Any:
        given = dict(enumerate(args, 1)) | kwargs  # positions and names in one table
        given.update({key: _as_query(given[key], query) for key in masks & given.keys()})
        return fn(query, *map(given.pop, range(1, len(args) + 1)), **given)

    return call


def _put(functions: list[tuple[Any, str, Callable[..., Tensor]]]) -> None:
    for owner, name, function in functions:
        setattr(owner, name, function)


def _wide(frame: Any) -> bool:
    """Whether the frame is the forward of a learner's module that holds float64 weights (one that
    check compares): its float32 casts keep float64."""
    owner = frame.f_locals.get("self")  # its weights are read only for a frame of the learner's file
    return _caller(frame) == LEARNER and torch.float64 in set(map(attrgetter("dtype"), itertools.chain(
        getattr(owner, "parameters", list)(), getattr(owner, "buffers", list)())))


def _caller(frame: Any) -> str:
    return frame.f_globals.get("__name__", "")[:len(LEARNER)]


def _swapped(args: tuple[Any, ...], kwargs: dict[str, Any], new: torch.dtype | None,
             ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments with torch.float32 (a dtype, given by position or by keyword) as `new`."""
    def swap(value: Any) -> Any:
        return new if value is torch.float32 else value
    return tuple(map(swap, args)), dict(zip(kwargs, map(swap, kwargs.values())))


def _float_kept(float_: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def kept(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return self.double() if _wide(sys._getframe(1)) else float_(self, *args, **kwargs)
    return kept


def _to_kept(to: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`.to` that, called so from a float64 module of the learner's (`x.to(torch.float32)`, Hugging
    Face's and CS336's norms, written for half precision), gives float64."""

    def kept(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if _wide(sys._getframe(1)):
            args, kwargs = _swapped(args, kwargs, torch.float64)
        return to(self, *args, **kwargs)

    return kept


FLOAT32_MAX = torch.finfo(torch.float32).max


def _full_kept(full: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """torch.full that, called from the learner's file without a dtype and with a number float32
    cannot hold (`torch.full((T, T), torch.finfo(x.dtype).min)` of check's float64 x), gives float64
    where it would raise; every other call as written."""

    def kept(size: Any, fill_value: Any, *args: Any, **kwargs: Any) -> Tensor:
        wide = isinstance(fill_value, float) and FLOAT32_MAX < abs(fill_value) < math.inf
        if wide and not args and "dtype" not in kwargs and _caller(sys._getframe(1)) == LEARNER:
            kwargs["dtype"] = torch.float64
        return full(size, fill_value, *args, **kwargs)

    return kept


def _masked_fill_kept(masked_fill: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`Tensor.masked_fill` that, called from the learner's file on a float32 tensor with a number
    float32 cannot hold (`torch.zeros(shape).masked_fill(~keep, torch.finfo(x.dtype).min)` of check's
    float64 x), fills a float64 copy where it would raise; every other call as written."""

    def kept(self: Tensor, mask: Tensor, value: Any) -> Tensor:
        wide = isinstance(value, float) and FLOAT32_MAX < abs(value) < math.inf
        if wide and self.dtype == torch.float32 and _caller(sys._getframe(1)) == LEARNER:
            self = self.double()
        return masked_fill(self, mask, value)

    return kept


def _upcast_kept(softmax: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A softmax (F.softmax, torch.softmax, a tensor's method; the log-softmax's too) that, called
    from the learner's file on float64 input with dtype torch.float32, keeps float64 (an upcast,
    never meant as a narrowing)."""

    def kept(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if (x.dtype, _caller(sys._getframe(1))) == (torch.float64, LEARNER):
            args, kwargs = _swapped(args, kwargs, None)
        return softmax(x, *args, **kwargs)

    return kept
