"""Where inside a module's own code the future first leaks: its forward run twice, on the inputs it had
when token AT was left alone and when it was changed (inputs that agree before AT), each tensor a line
of the file makes compared at the positions before AT on every axis the length of the sequence. Scores
(B, H, T, T) before the mask may move at key AT; their rows and columns 0..AT-1 may not. The first step
that moves there is the line that lets a position see a later one (a softmax over the queries' axis, a
convolution over positions not padded on the left).

Shape legend: B batch, T the sequence's length, AT the changed position."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from handformer.check.core.localize import Step, statement, trace_steps


def leaking_step(run: Callable[[Any], Any], inputs: tuple[Any, Any], T: int, at: int, filename: str,
                 masks: str) -> Step | None:
    """The first step of `filename`'s code that `run(inputs[i])` makes whose values before `at` (on each
    axis of length T) differ between the two runs; None where none does, where the runs part ways, or
    where a line applying a mask (`masks`: a pattern) lets a query before `at` see key `at` earlier (the
    mask is then the place, as its own rule says)."""
    a, b = map(lambda given: trace_steps(lambda: run(given), filename, every=True), inputs)
    for i, (x, y) in enumerate(zip(a, b)):  # the runs' steps pair up while they take the same branches
        masked = bool(re.search(masks, statement(filename, x.line)))
        if _moved_before(x.value, y.value, T, at, keys=masked):
            return {False: _grown_operand(a[:i], x, T, filename)}.get(masked)
    return None


def _grown_operand(before: list[Step], step: Step, T: int, filename: str) -> Step | None:
    """The operand of the leaking line made on an earlier line with its positions moved: a tensor of the
    step's rank with its positions grown (`_padded`: `F.pad(scores, ...)` padded on the wrong side,
    read whole by a convolution that is right as written); None where there is none, or where the line
    slices it (`y[..., -T:]`: the slice is the mistake), the step itself."""
    code = statement(filename, step.line)
    whole = set(re.findall(r"\w+", code)) - set(re.findall(r"(\w+)\s*\[", code))  # a slice of it: the slice
    return next((s for s in reversed(before) if s.name in whole and not s.given
                 and s.value.dim() == step.value.dim() and _padded(s.value, T)), step)


def _moved_before(x: Tensor, y: Tensor, T: int, at: int, keys: bool = False) -> bool:
    """Whether two values of one step differ at the positions before `at` of every axis of length T (with
    `keys`, of the first such axis alone: a query's row, every key in it)."""
    if x.shape != y.shape or T not in x.shape or not x.is_floating_point() or _padded(x, T):
        return False
    first = x.shape.index(T)  # a query's axis, where it has one of keys after it
    index = tuple(slice(0, {True: at}.get(n == T)) for n in x.shape)  # (..., :at, ..., :at, ...)
    x, y = {True: (x.narrow(first, 0, at), y.narrow(first, 0, at))}.get(keys, (x[index], y[index]))
    return not torch.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True)


PADDING = 8  # the most positions a padding adds (a kernel's width - 1)


def _padded(x: Tensor, T: int) -> bool:
    """Whether an axis of x is the positions grown by a padding (T < n <= T + PADDING): its positions
    are moved, and an axis of length T beside it is no position (d_model equal to T)."""
    return bool(set(x.shape) & set(range(T + 1, T + PADDING + 1)))
