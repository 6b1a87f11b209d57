"""A causal model's mask built somewhere else in the learner's file, judged where it is built.

    found = built_mask(lambda: model(idx), model, T)   # a Departure at the builder's line, or None

A model's first departing step is often the line that USES a wrong mask (`scores + mask`), the mask
itself a constant (no grad) made by a builder of theirs: a method or function that returns it
(Hugging Face's `_update_causal_mask`, OPT's `_make_causal_mask`), or a buffer made in `__init__`
(nanoGPT's `bias`). Such a value is judged by what it keeps: a two-valued (..., T, T) tensor read
either way (the larger value kept: 1 / True / an additive 0; or the smaller: a future mask) must keep
each query's own key and no later key, as every causal mask does (a window, a chunk or a sink keeps
less, never more). A mask that neither reading fits departs, and the line of the builder that made
its pattern is quoted, with the line that used it.

Shape legend: T length, N a buffer's length (N >= T).
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core.localize import Departure, Step, statement, trace_steps
from handformer.check.core.result import text
from handformer.check.core.source import parsed_file


def built_mask(run: Callable[[], Any], module: nn.Module, T: int) -> Departure | None:
    """The first mask a function of the module's file returns while `run()` runs it (or one of its
    buffers) that no causal reading fits, at the builder's line that made it; None where all fit."""
    filename = inspect.getsourcefile(type(module))
    steps = trace_steps(run, filename, every=True)  # each tensor each function of the file makes
    made = next((i for i, s in enumerate(steps) if s.name.startswith("return") and _departs(s.value, T, T)),
                None)
    if made is not None:
        origin = _origin(steps, made, T)
        return _departure(filename, origin.line, origin.name, origin.value, T)
    return _buffer(module, filename, T)


def with_use(found: Departure | None, used: Departure | None) -> Departure | None:
    """The builder's departure quoting the line that used its mask after its own (two lines at most)."""
    if found is None or used is None or used.line == found.line:
        return found or used
    return Departure(found.line, found.name, f"{found.code} / line {used.line}: {used.code}", found.form)


def _keep(value: Tensor, T: int, n: int | None = None) -> Tensor | None:
    """A two-valued (..., n, n) tensor's top-left (T, T) blocks read as keep = the larger value, (K, T,
    T) bool; None for any other (one value, three, another shape)."""
    n = n or value.size(-1)
    if value.dim() < 2 or value.shape[-2:] != (n, n) or n < T:
        return None
    block = value[..., :T, :T].reshape(-1, T, T)  # (K, T, T)
    values = block.unique()
    return block == values[-1] if values.numel() == 2 and not values.isnan().any() else None


def _fits(keep: Tensor) -> bool:
    """Each query keeps its own key and no later one (a window, a chunk, a sink: fewer earlier ones)."""
    T = keep.size(-1)
    later = ~torch.ones(T, T, dtype=torch.bool).tril()  # (T, T): key s > query t
    return not (keep & later).any() and bool(keep.diagonal(dim1=-2, dim2=-1).all())


def _departs(value: Tensor, T: int, n: int | None = None) -> bool:
    keep = _keep(value, T, n)
    return keep is not None and not _fits(keep) and not _fits(~keep)


def _origin(steps: list[Step], i: int, T: int) -> Step:
    """The earliest step before step i, back to the first (T, T) value that keeps another pattern
    (`torch.full(..., min)`: one value), whose pattern step i's is (`mask.masked_fill_(...)`, not the
    `.to(dtype)` or `.expand(...)` after it)."""
    keep, origin = _keep(steps[i].value, T), steps[i]
    for step in reversed(steps[:i]):
        if step.value.shape[-2:] != (T, T) or step.given:
            continue
        other = _keep(step.value, T)
        if other is None or not _same_pattern(other, keep):
            break
        origin = step
    return origin


def _same_pattern(a: Tensor, b: Tensor) -> bool:
    """Whether two (K, T, T) patterns are one read either way (one of K = 1 broadcast: a (T, T) mask
    before its `.expand(B, 1, T, T)`)."""
    if a.size(0) != b.size(0) and 1 not in (a.size(0), b.size(0)):
        return False
    return bool((a == b).all() or (a != b).all())


def _buffer(module: nn.Module, filename: str, T: int) -> Departure | None:
    """A mask buffer (or tensor attribute) of the module's parts, made in `__init__`, that no causal
    reading fits at its top-left (T, T): the line of the file that registers or assigns it."""
    for part in module.modules():
        kept = {**dict(part.named_buffers(recurse=False)),
                **{k: v for k, v in vars(part).items() if isinstance(v, Tensor) and not v.requires_grad}}
        for name, value in kept.items():
            line = _assigned_at(filename, name)
            if line and _departs(value.detach().double(), T, value.size(-1) if value.dim() >= 2 else None):
                return _departure(filename, line, f"self.{name}", value.detach().double(), T)
    return None


def _assigned_at(filename: str, name: str) -> int | None:
    """The one line that registers buffer `name` or assigns `self.name` (None where none, or several)."""
    pattern = re.compile(rf"register_buffer\(\s*['\"]{name}['\"]|\bself\.{name}\s*=(?!=)")
    lines = [n.lineno for n in ast.walk(parsed_file(filename)) if isinstance(n, ast.stmt)
             and not isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.If, ast.For, ast.With))
             and pattern.search(ast.get_source_segment(_source(filename), n) or "")]
    return lines[0] if len(lines) == 1 else None


ADDITIVE = -1e4  # a value this low is a masked place of an additive mask (-inf, finfo.min, -1e9)


@functools.lru_cache(maxsize=8)
def _source(filename: str) -> str:
    with open(filename, encoding="utf-8") as f:
        return f.read()


def _departure(filename: str, line: int, name: str, value: Tensor, T: int) -> Departure:
    """The builder's line, with what its mask keeps for one query against the causal mask's keys: read
    as additive (the larger value kept) where it holds -inf or a large negative, else the reading
    nearer the causal mask."""
    keep, t = _keep(value, T), T // 2
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    nearer = min((keep, ~keep), key=lambda k: int((k[0] ^ causal).sum()))
    reading = keep if value.min() <= ADDITIVE else nearer
    kept = reading[0, t].nonzero().flatten().tolist()
    form = text(f"the mask `{name}` built here keeps, for the query at position {t}, the keys at positions "
                f"{kept}; a causal mask keeps the keys at positions 0 .. {t} (its own and every earlier one)",
                f"这里构造的掩码 `{name}` 让位置 {t} 的查询保留位置 {kept} 的键；因果掩码保留位置 0 .. {t} "
                f"的键（它自己和之前的每一个）")
    return Departure(line, name, statement(filename, line), form)
