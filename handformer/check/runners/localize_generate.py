"""Where a generation loop that FAILs parts from greedy decoding, when no catalogued mistake explains
it. The loop runs once more, traced: every tensor its own code assigns, at every step of the loop, is
a step (the tokens depend on no gradient). The reference's sub-steps are those of each step of the
expected decoding, on the tokens the reference had then: the context (cropped to the block size),
the model's logits, those at the last position (divided by the loop's default temperature), their
softmax, the next token, the tokens with it appended. The first step of the loop's that is none of
them, at a shape one of them has, is where it parts: its line and its form (the logits of another
position than the last). Kept apart from generate_loop.py so that the loop's runner imports it one way.

Shape legend: B batch, t the context's length, V vocabulary.
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

from handformer.check.core.fingerprint import first_tensor, quietly
from handformer.check.core.localize import (
    Departure,
    Form,
    Step,
    View,
    first_departure,
    same,
    statement,
    trace_steps,
)
from handformer.check.core.result import Text, text
from handformer.check.runners.localize_cache import cached_call_departure

TEMPERATURE_NAMES = ("temperature", "temp", "tau")


def default_temperature(fn: Any) -> float:
    """The temperature the loop divides by when none is given: its parameter's default when that is a
    positive number, else 1 (greedy, or no temperature)."""
    for p in inspect.signature(fn).parameters.values():
        if p.name.lower() in TEMPERATURE_NAMES and isinstance(p.default, (int, float)) and p.default > 0:
            return float(p.default)
    return 1.0


def generate_views(logits_of: Callable[[Tensor], Tensor], prompt: Tensor, expected: Tensor, block: int,
                   temperature: float, top_k: int = 1) -> tuple[list[View], list[Form]]:
    """Each step's sub-steps of greedy decoding of `expected` (B, n) after `prompt` (B, T), the model
    called on the last `block` tokens through `logits_of` ((B, t) -> (B, t, V)), with the `top_k`
    likeliest kept as the run's filter keeps them; and the forms of a departing logits: those of
    another position than the last, of a top-k filter that keeps one token too many or too few or
    fills with 0."""
    stream, T = torch.cat([prompt, expected], 1), prompt.size(1)  # (B, T + n)
    views: list[View] = []
    forms: list[Form] = []
    for i in range(expected.size(1)):
        context = stream[:, max(0, T + i - block):T + i]  # (B, t)
        logits = logits_of(context).double()  # (B, t, V)
        last = logits[:, -1] / temperature  # (B, V)
        top1 = last.masked_fill(last < last.amax(-1, keepdim=True), -torch.inf)  # what top_k=1 keeps
        views += [("the tokens so far", stream[:, :T + i]), ("the context, cropped to the block size",
                                                              context),
                  ("the logits", logits), ("the logits at the last position", logits[:, -1]),
                  ("the logits at the last position", logits[:, -1:]),
                  ("the logits at the last position / temperature", last),
                  ("the probabilities", last.softmax(-1)),
                  ("the largest logit", last.max(-1, keepdim=True).values),  # (B, 1): what top_k=1 keeps
                  ("the logits, the likeliest alone kept (top_k=1)", top1),
                  ("the next token", stream[:, T + i:T + i + 1]), ("the next token", stream[:, T + i]),
                  ("the tokens with the new one appended", stream[:, :T + i + 1])]
        forms += _position_forms(logits, temperature) + _crop_forms(stream[:, :T + i], block)
        forms.append((text("the softmax over the batch, dim 0; the probabilities are over the vocabulary, "
                           "dim=-1", "softmax 沿 batch 维（dim 0）做了；概率应沿词表维 dim=-1")
                      | {"mistake": "sampling_softmax_wrong_dim"}, last.softmax(0)))
        forms.append((text("the logits with the likeliest alone kept (top_k=1), the others filled with 0, "
                           "not -inf: after the softmax they keep some probability", "只保留最可能的 token"
                           "（top_k=1），其余填的是 0 而不是 -inf：softmax 之后它们仍有概率")
                      | {"mistake": "filter_fill_finite"}, top1.masked_fill(top1 == -torch.inf, 0.0)))
        kept = (f"the logits, the {top_k} likeliest kept (top_k={top_k})", _kept(last, top_k))
        views += [kept] * (top_k > 1)
        forms += _top_k_forms(last, top_k)
    return views, forms


def _kept(last: Tensor, k: int) -> Tensor:
    """The logits (B, V) with the k largest kept, the others -inf (none kept for k = 0)."""
    ranked = torch.cat([torch.full_like(last[:, :1], torch.inf), last.sort(-1, descending=True).values], -1)
    return last.masked_fill(last < ranked[:, k:k + 1], -torch.inf)  # (inf first: none is as large)


def _top_k_forms(last: Tensor, k: int) -> list[Form]:
    """A top-k filter's mistakes: k - 1 or k + 1 tokens kept, the others -inf; the k kept, the others 0."""
    off = [(text(f"the logits with {n} kept, not top_k={k}: one token too few or too many",
                 f"保留了 {n} 个 token，而不是 top_k={k}：少了或多了一个") | {"mistake": "top_k_off_by_one"},
            _kept(last, n)) for n in (k - 1, k + 1)]
    finite = (text(f"the logits with the {k} likeliest kept, the others filled with 0, not -inf: after the "
                   "softmax they keep some probability", f"保留最可能的 {k} 个 token，其余填的是 0 而不是 "
                   "-inf：softmax 之后它们仍有概率") | {"mistake": "filter_fill_finite"},
              _kept(last, k).masked_fill(_kept(last, k) == -torch.inf, 0.0))
    return off + [finite] * (k > 1)


def _position_forms(logits: Tensor, temperature: float) -> list[Form]:
    """The logits (B, t, V) of each position but the last (divided by the temperature or not)."""
    t = logits.size(1)
    return [(text(f"the logits at position {p} of {t}; the next token is read from the last position, -1",
                  f"取的是 {t} 个位置中位置 {p} 的 logits；下一个 token 要从最后一个位置 -1 读"),
             logits[:, p] / scale) for p in range(t - 1) for scale in {1.0, temperature}]


def _crop_forms(tokens: Tensor, limit: int) -> list[Form]:
    """The tokens so far (B, T) cropped to another length than the block size."""
    return [(text(f"the last {k} tokens; the context is the last {limit} (the block size)",
                  f"取了最后 {k} 个 token；上下文应是最后 {limit} 个（block_size）"), tokens[:, -k:])
            for k in range(1, tokens.size(1))]  # the block size itself is a view, never a departure


def localize_generate(run: Callable[[], Any], fn: Any, views: list[View], forms: list[Form],
                      ) -> Departure | None:
    """Run the learner's loop once more (`run`), traced in its own code: the first tensor it makes
    that is none of the reference's sub-steps of its shape; where its model's calls through a cache
    part from the model's own run on the whole sequence, the line inside the model where they part."""
    steps, filename = _loop_steps(run, fn)
    unset = _unset(steps, filename)
    steps = [s for s in steps if not _filled(s, filename) and s.name not in unset]
    found = first_departure(steps, views, filename, {}, forms=forms)
    inner = found and quietly(lambda: cached_call_departure(run, filename))
    return replace(inner, called_from=(found.line, found.code)) if inner else found


def _filled(step: Step, filename: str) -> bool:
    """A tensor the loop fills with one value, not one it computes from the tokens (HF's
    `unfinished_sequences = torch.ones(batch_size, ...)`): its state, judged by no view."""
    one = bool((step.value == step.value.flatten()[:1]).all())  # every value the first (none: no step)
    return one and bool(FILLS.search(linecache.getline(filename, step.line)))


def _unset(steps: list[Step], filename: str) -> set[str]:
    """The names of a buffer the loop makes unset and fills as it goes (litgpt's `empty =
    torch.empty(max_returned_tokens)`, then `idx = empty`): its other values are whatever memory held,
    so it is judged by no view; the context the loop reads from it still is."""
    unset: set[str] = set()
    for step in steps:
        line = linecache.getline(filename, step.line)
        alias = re.match(r"\s*(\w+)\s*=\s*(\w+)\s*(#.*)?$", line)
        if UNSET.search(line) or alias and alias[2] in unset:
            unset.add(step.name)
    return unset


# a tensor whose values are not set: torch.empty(...)
UNSET = re.compile(r"\bempty(_like)?\(")


# a tensor made of one value: torch.ones(...), torch.zeros_like(...), torch.full(...)
FILLS = re.compile(r"\b(ones|zeros|full|empty)(_like)?\(")


def _loop_steps(run: Callable[[], Any], fn: Any, parts: list[tuple[str, nn.Module]] = (),
                ) -> tuple[list[Step], str]:
    """The steps of the loop `fn` run once more (`run`), traced in its own code (every tensor it
    assigns, at every step of the loop; the outputs of `parts` too), and its file; where it raises
    further on, the steps up to there."""
    code = inspect.unwrap(getattr(fn, "__func__", fn))
    filename = inspect.getsourcefile(code)
    steps: list[Step] = []
    # where it raises further on, the steps up to there are judged
    quietly(lambda: trace_steps(run, filename, code.__code__, parts, every=True, into=steps))
    return steps, filename


def position_departure(run: Callable[[], Any], fn: Any, model: nn.Module) -> Departure | None:
    """Run the learner's decoding loop once more (`run`), traced in its own code with the outputs of
    `model`'s parts recorded with what they were given: the first part handed a row (B, D) that is
    position p of a tensor (B, t, D) or (t, B, D) its own code made before, p not the last, t > 1 (a
    decoder output read at position 0): the next token is read from the last position."""
    steps, filename = _loop_steps(run, fn, list(model.named_modules())[1:])
    for i, step in enumerate(steps):
        row = first_tensor(step.part[1], 2) if step.part else None  # what a part was handed
        form = row is not None and _position_read(row, steps[:i])
        if form:
            return Departure(step.line, step.name, statement(filename, step.line), form)
    return None


def _position_read(row: Tensor, earlier: list[Step]) -> Text | None:
    """The form of a row (B, D) that is position p of the latest earlier step (B, t, D) or (t, B, D)
    holding it, p not the last; None when it is the last (or no such step holds it)."""
    for step, axis in itertools.product(reversed(earlier), (1, 0)):
        value = step.value
        t = value.size(axis) if value.dim() == 3 else 0
        at = [same(row, value.select(axis, p)) for p in range(t)]
        if True in at:
            p = at.index(True)
            return None if at[-1] else text(
                f"the row of `{step.name}` at position {p} of {t} along dim={axis}; the next token is "
                "read from the last position, -1",
                f"取的是 `{step.name}` 在 dim={axis} 上 {t} 个位置中位置 {p} 的那一行；下一个 token 要从"
                "最后一个位置 -1 读")
    return None
