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

import inspect
import itertools
import linecache
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core.localize import Departure, Step, statement, trace_steps
from handformer.check.core.result import text
from handformer.check.core.source import with_second


def built_mask(run: Callable[[], Any], module: nn.Module, T: int) -> Departure | None:
    """The first mask a function of the module's file returns while `run()` runs it (else one of its
    buffers) that no causal reading fits, at the builder's line that made it; None where all fit."""
    filename = inspect.getsourcefile(type(module))
    steps = trace_steps(run, filename, every=True)  # each tensor each function of the file makes
    made = [_origin(steps, i, T) for i, s in enumerate(steps)
            if s.name.startswith("return") and _departs(s.value, T)]
    return next(map(lambda s: _departure(filename, s, T), made or _buffers(module, filename, T)), None)


def with_use(used: Departure | None, found: Departure | None) -> Departure | None:
    """The builder's departure (`found`) quoting the line that used its mask (`used`, where the run
    departs) after its own: two lines at most; `used` where no builder departs, `found` as it is where
    it quotes two lines already (a buffer's value built on the line above the one registering it)."""
    if len({getattr(found, "line", None), getattr(used, "line", None)} - {None}) < 2:  # one, or one line
        return found or used
    return replace(found, code=with_second(found.line, found.code, used.line, used.code)[1])


def _keep(value: Tensor, T: int) -> Tensor:
    """A two-valued (..., N, N) tensor's top-left (T, T) blocks read as keep = the larger value, (K, T, T)
    bool, N >= T; none, (0, T, T), for any other (one value, three, another shape)."""
    value = torch.atleast_2d(value)
    block = value.reshape(value.shape[:-2].numel(), *value.shape[-2:])[:, :T, :T]  # (K, T', T'), T' <= T
    values = block.unique()
    # two values, neither NaN, in a square at least (T, T)
    seen = (values.numel(), int((values == values).sum()), value.size(-1), *block.shape[1:])
    none = torch.zeros(0, T, T, dtype=torch.bool)
    return block == values[-1] if seen == (2, 2, value.size(-2), T, T) else none


def _fits(keep: Tensor) -> bool:
    """Each query keeps its own key and no later one (a window, a chunk, a sink: fewer earlier ones),
    but in a prefix whose queries all see all of it (GLM's prefix-LM mask)."""
    T, whole = keep.size(-1), keep.all(0)  # (T, T): kept in every row of the batch
    shared = max(p for p in range(T + 1) if whole[:p, :p].all())  # the prefix's length
    position = torch.arange(T)
    prefix = (position[:, None] < shared) & (position < shared)  # (T, T)
    later = ~torch.ones(T, T, dtype=torch.bool).tril() & ~prefix  # (T, T): key s > query t, past the prefix
    own = torch.eye(T, dtype=torch.bool)
    return not bool((keep & later | own & ~keep).any())


def _departs(value: Tensor, T: int) -> bool:
    keep = _keep(value, T)
    return not any(map(_fits, (keep, ~keep)))


def _origin(steps: list[Step], i: int, T: int) -> Step:
    """The earliest step before step i, back to the first (T, T) value that keeps another pattern
    (`torch.full(..., min)`: one value), whose pattern step i's is (`mask.masked_fill_(...)`, not the
    `.to(dtype)` or `.expand(...)` after it); steps of other shapes are passed over."""
    keep = _keep(steps[i].value, T)
    shaped = [s for s in reversed(steps[:i]) if (s.value.shape[-2:], s.given) == ((T, T), False)]
    same = itertools.takewhile(lambda s: _same_pattern(_keep(s.value, T), keep), shaped)
    return ([steps[i], *same])[-1]


def _same_pattern(a: Tensor, b: Tensor) -> bool:
    """Whether two (K, T, T) patterns are one read either way, each of its distinct (T, T) slices (a
    (T, T) mask before its `.expand(B, 1, T, T)`)."""
    a, b = a.unique(dim=0), b.unique(dim=0)
    return max(torch.equal(a, b), torch.equal(a, ~b))


def _buffers(module: nn.Module, filename: str, T: int) -> list[Step]:
    """The mask buffers (and tensor attributes) of the module's parts, made in `__init__`, that no
    causal reading fits at their top-left (T, T), each at the one line that registers or assigns it."""
    kept = {name: value.detach().double() for part in module.modules()
            for name, value in [*part.named_buffers(recurse=False), *vars(part).items()]
            if isinstance(value, Tensor)}
    return [Step(line, f"self.{name}", value) for name, value in kept.items()
            for line in _assigned_at(filename, name) if _departs(value, T)]


def built_at(filename: str, line: int) -> int | None:
    """The line that built the value the line at `line` stores (`self.register_buffer("bias", mask.view(1,
    1, N, N))` after `mask = torch.tril(...)`): the latest earlier line of the same function that binds
    the name the stored value is read from through reshapes, casts and indexing (`mask.view(...)`,
    `mask[None].float()`); None where the line builds the value itself (`torch.tril(...)`, or a step
    that moves the entries: `mask.transpose(-2, -1)`, `mask == 0`)."""
    lines = linecache.getlines(filename)[:line]
    name = next(iter(STORED.findall(lines[-1])), "")
    start = max((n for n, text in enumerate(lines, 1) if DEF.match(text)), default=0)
    binds = re.compile(rf"\s*{name}\s*=(?!=)")  # `mask = ...`, not `mask == ...`
    return max((n for n in range(start + 1, line) if binds.match(lines[n - 1])), default=None)  # "": none


# the methods that reshape, cast or copy a tensor, its pattern kept
LAYOUT = ("view|reshape|unsqueeze|expand|to|float|bool|int|long|double|half|contiguous|clone|detach|type_as|"
          "squeeze")
# a line that stores a name's value as a buffer or an attribute, through LAYOUT's methods and indexing
# (`register_buffer("bias", mask.view(1, 1, n, n))`, `self.keep = visible[None, None]`): the name
STORED = re.compile(rf"(?:register_buffer\(\s*['\"]\w+['\"]\s*,|\bself\.\w+\s*=(?!=))\s*([A-Za-z_]\w*)"
                    rf"(?:\.(?:{LAYOUT})\([^()]*\)|\[[^\]]*\])*\s*(?:[,)]|#|$)")
DEF = re.compile(r"\s*(?:async\s+)?def\s")


def _assigned_at(filename: str, name: str) -> list[int]:
    """The one line that registers buffer `name` or assigns `self.name`; none where none does, or several."""
    pattern = re.compile(rf"register_buffer\(\s*['\"]{name}['\"]|\bself\.{name}\s*=(?!=)")
    lines = [n for n, line in enumerate(linecache.getlines(filename), 1) if pattern.search(line)]
    return lines * (len(lines) == 1)


ADDITIVE = -1e4  # a value this low is a masked place of an additive mask (-inf, finfo.min, -1e9)


def _departure(filename: str, step: Step, T: int) -> Departure:
    """The builder's line, with what its mask keeps for one query against the causal mask's keys: read
    as additive (the larger value kept) where it holds -inf or a large negative, else the reading
    nearer the causal mask. A buffer's line that stores a value built on an earlier line is quoted after
    that line (see `built_at`)."""
    line, name, value = step.line, step.name, step.value
    built = step.name.startswith("self.") and built_at(filename, line)
    keep, t = _keep(value, T), T // 2
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    nearer = min((keep, ~keep), key=lambda k: int((k[0] ^ causal).sum()))
    kept = (nearer, keep)[bool(value.min() <= ADDITIVE)][0, t].nonzero().flatten().tolist()
    form = text(f"the mask `{name}` built here keeps, for the query at position {t}, the keys at positions "
                f"{kept}; a causal mask keeps the keys at positions 0 .. {t} (its own and every earlier one)",
                f"这里构造的掩码 `{name}` 让位置 {t} 的查询保留位置 {kept} 的键；因果掩码保留位置 0 .. {t} "
                f"的键（它自己和之前的每一个）")
    first = built or line  # the storing line after the building one, where it is another
    quoted = with_second(first, statement(filename, first), line * bool(built), statement(filename, line))
    return Departure(quoted[0], name, quoted[1], {**form, "variant": CAUSAL_BUILT})


CAUSAL_BUILT = "causal_mask_built"  # a finding's form: a mask judged by what it keeps, not by the reference
