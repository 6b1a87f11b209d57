"""A pre-allocated KV cache as Meta's llama writes it, read from the code of a component that failed:
`self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk` writes the new keys at the positions from
start_pos on, `keys = self.cache_k[:bsz, : start_pos + seqlen]` reads every key up to the last one
written. The bounds are evaluated with start_pos and every other name bound to numbers of their own:
a write that does not begin at start_pos (kv_cache_write_offset), or a read that does not end where the
write ends (kv_cache_read_range), is the mistake, at its line. A read inside another expression
(`torch.cat([self.cache_k[:bsz, :start_pos], xk], 1)`, the new keys added apart) is not judged.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from typing import Any

from handformer.check.core.result import Finding, text

POSITIONS = ("start_pos", "pos", "offset", "start", "position", "cache_pos", "input_pos")
START = 5  # start_pos; every other name gets a prime of its own, none a sum of two others


def cache_slice_findings(obj: Any) -> list[Finding]:
    """The findings of each method of `obj` (a class, or a function) that writes and reads a cache."""
    methods = vars(obj).values() if inspect.isclass(obj) else [obj]
    return sum(map(_in_function, filter(inspect.isfunction, methods)), [])


def _in_function(fn: Any) -> list[Finding]:
    try:
        source, first = inspect.getsourcelines(fn)
        node = ast.parse(textwrap.dedent("".join(source))).body[0]
        params = set(inspect.signature(fn).parameters)
    except (OSError, TypeError, SyntaxError, ValueError):
        return []
    start = next(iter(sorted(params & set(POSITIONS), key=POSITIONS.index)), "")
    names = _Numbers({start: START})
    writes, reads = _accesses(node)
    found: dict[str, Finding] = {}  # one finding a name: a wrong write, a wrong read
    for write, read in itertools.product(writes, reads):  # the same buffer and axis, the write at start
        bounds = [_value(e, names) for e in (*write[2:4], *read[2:4])]
        if write[:2] != read[:2] or not _mentions(write[2], start) or None in bounds:
            continue
        end = START + bounds[1] - bounds[0]  # start_pos + the call's length
        wrong = {"kv_cache_write_offset": bounds[0] != START, "kv_cache_read_range": bounds[2:] != [0, end]}
        for name in filter(wrong.get, wrong):
            at = {"kv_cache_write_offset": write[4], "kv_cache_read_range": read[4]}[name]
            shown = {k: v for k, v in names.items() if k in ast.unparse(write[3])}  # the write's end reads
            found.setdefault(name, _finding(name, (at + first - 1, source[at - 1].strip()), shown, bounds))
    return list(found.values())


Access = tuple[str, int, Any, Any, int]  # (buffer, axis, lower bound, upper bound, line)


def _accesses(fn: ast.AST) -> tuple[list[Access], list[Access]]:
    """The slices a function writes into `self.X[...] = v` and reads as `k = self.X[...]` (maybe
    followed by method calls: `.transpose(1, 2)`), by buffer and axis."""
    writes, reads = [], []
    for node in filter(lambda n: isinstance(n, ast.Assign), ast.walk(fn)):
        writes += _sliced(node.targets[0], node.lineno)
        value = node.value
        while isinstance(getattr(value, "func", None), ast.Attribute):  # a call of a method
            value = value.func.value  # self.cache_k[...].transpose(1, 2): the subscript under the calls
        reads += _sliced(value, node.lineno)
    return writes, reads


def _sliced(node: ast.AST, line: int) -> list[Access]:
    """Each slice of `self.X[a, b:c, ...]`, by its axis."""
    match node:
        case ast.Subscript(value=ast.Attribute(value=ast.Name(id="self"), attr=buffer), slice=index):
            parts = getattr(index, "elts", [index])  # one index, or a tuple of them
            return [(buffer, i, p.lower, p.upper, line) for i, p in enumerate(parts)
                    if isinstance(p, ast.Slice)]
    return []


def _mentions(node: Any, name: str) -> bool:
    return name in {n.id for n in ast.walk(node or ast.Pass()) if isinstance(n, ast.Name)}


PRIMES = (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)
# what a bound may be made of: names (and attributes), whole numbers, + - * //
SAFE = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Attribute, ast.Load, ast.Constant, ast.Add,
        ast.Sub, ast.Mult, ast.FloorDiv, ast.USub)


class _Numbers(dict):
    """The number each name of the bounds stands for: start_pos its own, a new name the next prime."""

    def __missing__(self, name: str) -> int:
        self[name] = PRIMES[(len(self) - 1) % len(PRIMES)]
        return self[name]


def _value(node: Any, names: _Numbers) -> int | None:
    """A bound's value, its names (`self.n` read as `self_n`) bound in `names`; an omitted bound is 0;
    None for what is not made of names and whole numbers."""
    flat = ast.parse(ast.unparse(node or ast.Constant(0)).replace("self.", "self_"), mode="eval")
    try:
        safe = all(isinstance(n, SAFE) for n in ast.walk(flat))
        return int(eval(compile(flat, "<bound>", "eval"), {"__builtins__": {}}, names)) if safe else None
    except (TypeError, ValueError, ZeroDivisionError):
        return None


def _finding(name: str, at: tuple[int, str], names: dict[str, int], bounds: list[int]) -> Finding:
    """The finding at its line: the positions written and read, with the numbers the names stood for."""
    given = ", ".join(f"{k} = {v}" for k, v in names.items())
    spans = f"{bounds[0]}..{bounds[1] - 1}", f"{bounds[2]}..{bounds[3] - 1}"
    return Finding(name, text(f"with {given}: the new keys are written at positions {spans[0]}, the keys "
                              f"read back are those at {spans[1]}",
                              f"当 {given} 时：新的键写在位置 {spans[0]}，读回的是位置 {spans[1]} 的键"), *at)
