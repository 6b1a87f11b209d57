"""Where a model's cached decoding parts from its own decoding without a cache: the learner's code run
twice, on the whole sequence without a cache (which matched the reference), and on a prefix then the
rest through the cache; each tensor a line of theirs makes on the cached path is compared with the
same line's tensor on the whole sequence, at the positions the call covers. The first that differs is
the departure (a causal mask not offset by the start, a rotary table read from position 0).

Shape legend: T the whole sequence's length; a call covers positions a..b-1."""

from __future__ import annotations

import ast
import copy
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core.fingerprint import hooked, quietly
from handformer.check.core.localize import Departure, Step, statement, trace_steps
from handformer.check.core.result import text
from handformer.check.core.source import parsed_file


def _aligned(whole: Tensor, part: Tensor, T: int, a: int, b: int) -> Tensor:
    """The whole run's tensor at the positions a call over a..b-1 covers (the queries a..b-1, the
    keys 0..b-1 it sees); the part itself where the shapes do not line up so (nothing to judge)."""
    index = [dict([(b - a, slice(a, b)), (b, slice(0, b))] * (full == T) + [(full, slice(None))]).get(got)
             for full, got in zip(whole.shape, part.shape)]  # a size of T is cut to the call's positions
    judged = None not in index and whole.dim() == part.dim() and (b == T or T in whole.shape)
    return whole[tuple(index)] if judged else part  # (DeepSeek's h[:, -1], the last position alone: b - 1's)


def cache_departure(whole: Callable[[], Any], calls: list[tuple[Callable[[], Any], int, int]], T: int,
                    filename: str) -> Departure | None:
    """The first tensor a line makes on the cached path (`calls`: each run with the positions a..b-1
    it covers) that differs from that line's on the whole sequence (`whole`)."""
    reference = _by_occurrence(trace_steps(whole, filename, every=True))
    for run, a, b in calls:
        traced = trace_steps(run, filename, every=True)
        found = _call_departure(reference, traced, T, a, b, filename)
        if found is not None:
            return replace(found, ran=_spans(filename, traced.entered))
    return None


def _spans(filename: str, entered: frozenset[int]) -> frozenset[tuple[int, int]]:
    """The (first, last) lines of each function of the file that a run entered (their first lines):
    a named finding quoted outside all of them (a model's generate, when its forward parts) is not
    where the run parts."""
    return frozenset((f.lineno, f.end_lineno) for f in ast.walk(parsed_file(filename))
                     if isinstance(f, ast.FunctionDef) and f.lineno - len(f.decorator_list) in entered)


def _call_departure(reference: dict[Any, Step], traced: list[Step], T: int, a: int, b: int, filename: str,
                    ) -> Departure | None:
    """The first step of one cached call over positions a..b-1 that differs from the whole sequence's."""
    steps = list(_by_occurrence(traced).items())
    ran = {s.line for _, s in steps}  # a name made on a line of the other branch (`if use_cache: pos = ...`)
    named = {s.name: s for s in reversed(reference.values()) if s.line not in ran}  # its first
    for i, (key, step) in enumerate(steps):
        whole = reference.get(key, named.get(step.name, step)).value
        want = _aligned(whole, step.value, T, a, b)
        if not torch.allclose(step.value, want, atol=1e-6, equal_nan=True):
            form = _restarted(step, want, a, [s for _, s in steps[i + 1:]], filename) or _read_from_zero(
                step, _aligned(whole, step.value, T, 0, b - a), a, filename) or text(
                f"on the cached call over positions {a}..{b - 1}; the whole sequence's value there differs",
                f"出现在用缓存的调用里（位置 {a}..{b - 1}）；整句计算时那里的值不同")
            return _from_cache(steps[:i], reference, step, filename, form)
    return None


def _restarted(step: Step, want: Tensor, a: int, after: list[Step], filename: str) -> Any:
    """The form of positions that restart at 0 on a cached call over a..b-1, where the whole sequence's
    are a..b-1; named rope_no_offset when a later line reads them into a rotary table
    (`self.freqs_cos[pos]`). None when the step is not so."""
    if not torch.equal(step.value, want - a):
        return None
    later = "\n".join(statement(filename, s.line) for s in after)
    rotary = re.search(rf"(?im)^(?=.*\b{re.escape(step.name)}\b).*(freq|cos|sin|rot|rope)", later)
    return text(f"the positions start at 0 on the cached call; they are {a}.. there, after the {a} cached "
                "tokens", f"用缓存的调用里位置从 0 开始；应从 {a} 开始，接在缓存的 {a} 个 token 之后"
                ) | ({"mistake": "rope_no_offset"} if rotary else {})


def _read_from_zero(step: Step, first: Tensor, a: int, filename: str) -> Any:
    """rope_no_offset where a rotary table's rows on a cached call over a..b-1 are the whole sequence's
    rows 0..b-a-1 (`self.freqs_cis[:seqlen]`, `self.cos[:, :T]`); None when the step is not so."""
    rotary = re.search(r"(?i)freq|cos|sin|rot|rope|complex",  # its name, or a table of complex numbers
                       f"{step.name} {statement(filename, step.line)} {step.value.dtype}")
    if not rotary or step.value.shape != first.shape or not torch.allclose(step.value, first):
        return None
    return text(f"the rotary table is read from position 0 on the cached call; it is read from {a} there, "
                f"after the {a} cached tokens", f"用缓存的调用里旋转表从位置 0 开始读；应从 {a} 开始读，"
                f"接在缓存的 {a} 个 token 之后") | {"mistake": "rope_no_offset"}


class _Calls:
    """The calls of the file's modules that are handed token ids (B, n) first, during a run (a loop's
    calls of the model): the tokens, the index of the run's first step in it, and the module and its
    arguments as they were before the call (a cache still empty before the first)."""

    def __init__(self, filename: str, steps: list[Step]) -> None:
        self.filename, self.steps = filename, steps
        self.made: list[tuple[Tensor, int, tuple[nn.Module, tuple[Any, ...]]]] = []

    def before(self, module: nn.Module, args: tuple[Any, ...]) -> bool:
        """Whether the call is handed token ids first (then it is recorded)."""
        tokens = next(iter(args), None)
        handed = isinstance(tokens, Tensor) and tokens.dim() == 2 and not tokens.is_floating_point()
        self.made += [(tokens.clone(), len(self.steps), copy.deepcopy((module, args)))] * handed
        return handed


def cached_call_departure(run: Callable[[], Any], filename: str) -> Departure | None:
    """A loop that calls the learner's model through its cache (the prompt, then each new token), run
    traced in every function of the file: the first line of a later call whose tensors differ from
    the model's own on the whole sequence so far, run afresh (the model and its arguments as they were
    before the first call, the tokens of every call so far)."""
    steps: list[Step] = []
    calls = _Calls(filename, steps)
    with hooked([_Profiled(filename, calls)]):  # where it raises further on, the calls so far are judged
        quietly(lambda: trace_steps(run, filename, every=True, into=steps))
    if len(calls.made) < 2 or calls.made[1][0].size(1) >= calls.made[0][0].size(1):
        return None  # each call handed the whole context (cropped or not): no cache to judge
    starts = [start for _, start, _ in calls.made] + [len(steps)]
    for k in range(1, len(calls.made)):
        tokens = torch.cat([ids for ids, _, _ in calls.made[:k + 1]], 1)  # (B, b)
        a, b = tokens.size(1) - calls.made[k][0].size(1), tokens.size(1)
        found = _call_departure(_whole(calls.made[0][2], tokens, filename), steps[starts[k]:starts[k + 1]],
                                b, a, b, filename)  # the loop's own steps there: lines the whole run has not
        if found is not None:
            return found
    return None


class _Profiled:
    """Each call of a forward of the file handed token ids while no other such call is running (the
    loop's call, not the one its model makes of a model it wraps: HF's `StableLmForCausalLM` calling its
    `StableLmModel` on the same ids), whether the loop calls the model (`model(ids)`) or its forward
    itself (Mistral's `model.forward(ids, positions, cache)`, past the module's hooks), handed to
    `calls` with its arguments, until removed (a handle as torch's hooks give)."""

    def __init__(self, filename: str, calls: _Calls) -> None:
        self.filename, self.calls, self.old = filename, calls, sys.getprofile()
        self.running: list[Any] = []  # the frames of the calls handed to `calls` that are running now
        sys.setprofile(self.profile)

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        if (code.co_name, code.co_filename) != ("forward", self.filename) or event not in ("call", "return"):
            return
        if event == "return":
            self.running = [f for f in self.running if f is not frame]
            return
        names = code.co_varnames[:code.co_argcount]
        module = frame.f_locals.get(next(iter(names), ""))
        if isinstance(module, nn.Module) and not self.running and self.calls.before(
                module, tuple(frame.f_locals[n] for n in names[1:])):
            self.running.append(frame)

    def remove(self) -> None:
        sys.setprofile(self.old)


def _whole(first: tuple[nn.Module, tuple[Any, ...]], tokens: Tensor, filename: str,
           ) -> dict[tuple[int, str, int], Step]:
    """The model's steps on the whole sequence `tokens`, from its state before the loop's first call."""
    module, args = copy.deepcopy(first)
    forward = type(module).forward  # its own, not a wrapper the loop's driver set on the instance
    rest = [_stretched(arg, args[0].size(1), tokens.size(1)) for arg in args[1:]]
    steps = trace_steps(lambda: forward(module, tokens, *rest), filename, every=True)
    return _by_occurrence(steps)


def _stretched(arg: Any, n: int, b: int) -> Any:
    """The first call's positions 0 .. n - 1 (Mistral's forward(input_ids, positions, cache)) as those
    of the whole sequence, 0 .. b - 1; any other argument as it was."""
    positions = isinstance(arg, Tensor) and arg.dim() == 1 and torch.equal(arg, torch.arange(n))
    return {True: torch.arange(b)}.get(positions, arg)


def _from_cache(before: list[tuple[tuple[int, str, int], Step]], reference: dict[Any, Step], step: Step,
                filename: str, form: Any) -> Departure:
    """The departure at `step`, or, when a value its line reads came from a line that only the cached
    path runs (`k, v = cache.update(...)`), at the line of that helper which writes what it returned
    there (`self.v[layer][...] = k`), called from that line; or, when the step is a buffer its helper
    returns, at the helper's line that writes it."""
    write = _returned_write(filename, step)
    if write is not None:
        said = text(f"; what line {step.line} returns ({statement(filename, step.line)}) is read from what "
                    f"this line writes", f"；第 {step.line} 行返回的值读自这一行写入的内容")
        form = form | text(form["en"] + said["en"], form["zh"] + said["zh"])
        return Departure(write, step.name, statement(filename, write), form)
    used = set(re.findall(r"\w+", statement(filename, step.line))) | {step.name}  # what its line reads
    origin = next((s for key, s in reversed(before) if s.name in used and key not in reference), None)
    written = _written_line(filename, origin)
    if written is None:
        return Departure(step.line, step.name, statement(filename, step.line), form)
    return Departure(written, step.name, statement(filename, written), form,
                     called_from=(origin.line, statement(filename, origin.line)))


def _written_line(filename: str, origin: Step | None) -> int | None:
    """For `a, b = obj.method(...)` at the origin's line, the line of the file's `method` that writes
    into the buffer it returns as the origin's name (its `return self.k[...], self.v[...]`: the line
    `self.v[...] = ...`); None where the code is not so."""
    nodes = list(ast.walk(parsed_file(filename)))
    try:  # the statement at that line comes first in the walk, before the nodes inside it
        call = next(n for n in nodes if getattr(n, "lineno", 0) == origin.line)
        names = list(map(ast.unparse, call.targets[0].elts))
        method = next(f for f in nodes if getattr(f, "name", None) == call.value.func.attr)
        buffer = _base(method.body[-1].value.elts[names.index(origin.name)])  # its return statement
        return next(n.lineno for n in method.body if _base(getattr(n, "targets", [n])[0]) == buffer)
    except (AttributeError, IndexError, ValueError, StopIteration):  # not a helper that returns its buffers
        return None


RETURNED = re.compile(r"return\[?(\d*)\]?")  # a value a function returns: `return`, `return[1]`


def _returned_write(filename: str, step: Step) -> int | None:
    """For a value a helper returns out of a buffer (`return self.k[layer, :, :, :end], ...`), the
    nearest line before it that writes into that buffer (`self.k[layer, :, :, start:end] = k`): the read
    gives back what the write put there (a cache written at the wrong offset). None where the step is
    not so."""
    nodes = list(ast.walk(parsed_file(filename)))
    returned = {n.lineno: n.value for n in nodes if isinstance(n, ast.Return)}.get(step.line)
    try:  # the step's value among those its line returns
        read = [*getattr(returned, "elts", [returned])][int("0" + RETURNED.fullmatch(step.name)[1])]
    except (TypeError, IndexError):  # not a returned value, or not of the file
        return None
    written = f"{_base(read)}["  # a write into the buffer (`a[...], b[...] = k, v` too), not a new binding
    return max([n.lineno for n in nodes if isinstance(n, ast.Assign) and n.lineno < step.line
                and written in ast.unparse(n.targets[0])], default=None)


def _base(node: ast.AST) -> str:
    """`self.v` for `self.v[layer][:, :, :n]`: the expression under the subscripts."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return ast.unparse(node)


def _by_occurrence(steps: list[Step]) -> dict[tuple[int, str, int], Step]:
    """Each step by (line, name, how many times that line made that name before): one layer's step
    lines up with the same layer's on the other run."""
    seen: Counter[tuple[int, str]] = Counter()
    out = {}
    for s in steps:
        out[(s.line, s.name, seen[(s.line, s.name)])] = s
        seen[(s.line, s.name)] += 1
    return out
