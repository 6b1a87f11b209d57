"""How a generation loop reads its count and its context limit, from the form of its code, so that a
named loop mistake is charged only where its premise was offered in the form the loop reads it.

The count: a parameter no name says is one, that the loop counts its steps by (OLMo's
`for step in range(max_steps)`, a `while` test `len(tokens) < n_predict`). The crop: a loop that reads a
context limit crops by it when the limit is written inside a slice of what it feeds (`idx[:, -block_size:]`)
or is handed to a helper of its own (`crop(idx, block_size)`), or when the limit is an argument it never
uses (the crop left out); it stops at it when the limit (or a name bound from it) is compared with or
bounds a range; a loop that reads the limit only for something else (prompt lookup's room left for a
draft, sliced off the draft) keeps the context within it by its caller, and is not run past it.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

from handformer.check.core.argument_names import COUNT_NAMES, MODEL_NAMES, PROMPT_NAMES
from handformer.check.core.source import function_nodes

# the calls of Python's own that read a limit without cropping anything by it
BUILTINS = frozenset({"min", "max", "int", "len", "range", "abs", "print", "float", "str", "isinstance"})


def counted_parameter(fn: Any) -> str | None:
    """The parameter a loop counts its steps by where none is named for a count (COUNT_NAMES): the first
    one (an int, or required; not the model or the prompt) that a `for` loop's range(...) or a `while`
    test reads; None where one is named so, or none is read so."""
    params = _parameters(fn)
    if any(p.name.lower() in COUNT_NAMES for p in params):
        return None
    ints = {p.name for p in params if p.name.lower() not in MODEL_NAMES + PROMPT_NAMES + ("self",)
            and (p.default is p.empty or type(p.default) is int)}
    bounds = [node.iter if isinstance(node, ast.For) else node.test for node in function_nodes(fn)
              if isinstance(node, ast.While) or isinstance(node, ast.For) and _range(node.iter)]
    read = [n.id for bound in bounds for n in _values(bound) if n.id in ints]
    return read[0] if read else None


def _values(node: ast.AST) -> list[ast.Name]:
    """The names read as values in an expression: not an object whose attribute or item is read
    (`settings.max_tokens` reads max_tokens, not settings)."""
    held = {id(n.value) for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Subscript))}
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in held]


def _range(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", "") == "range"


def _parameters(fn: Any) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def crops_by_limit(fn: Any, names: tuple[str, ...], attrs: tuple[str, ...]) -> bool | None:
    """Whether a loop that reads a context limit (a name in `names`, an attribute in `attrs`: a config's
    .seq_length, where a local seq_len is no limit) crops or stops by it: the limit inside a slice,
    handed to a call of its own, compared with or bounding a range (itself or a name bound from it),
    or an argument it never uses (True); read only otherwise (False); None where it reads none."""
    nodes = function_nodes(fn)
    reads = [n for n in nodes if _limit(n, names, attrs)]
    used = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if any(p.name.lower() in names and p.name not in used for p in _parameters(fn)):
        return True  # handed a limit it never uses: the crop left out
    if not reads:
        return None
    parents = {id(child): node for node in nodes for child in ast.iter_child_nodes(node)}
    targets = [t for n in reads for t in getattr(_statement(n, parents), "targets", [])]
    bound = {t.id for t in targets if isinstance(t, ast.Name)}  # max_len = config.max_position_embeddings
    kept = reads + [n for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                    and n.id in bound]
    return any(_cropping(n, parents) for n in reads) or any(_stopping(n, parents) for n in kept)


def _statement(node: ast.AST, parents: dict[int, ast.AST]) -> ast.AST | None:
    while node is not None and not isinstance(node, ast.stmt):
        node = parents.get(id(node))
    return node


def _stopping(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether the limit read at `node` (or a name bound from it: `max_len = config.max_position_embeddings`)
    is compared with (`if T >= max_len: break`) or bounds a range (`range(room)`): the loop stops at it."""
    parent = parents.get(id(node))
    while parent is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.Compare) or _range(parent):
            return True
        parent = parents.get(id(parent))
    return False


def _limit(node: ast.AST, names: tuple[str, ...], attrs: tuple[str, ...]) -> bool:
    if isinstance(node, ast.Name):
        return node.id.lower() in names
    return isinstance(node, ast.Attribute) and node.attr.lower() in names + attrs


def _cropping(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether the limit read at `node` sits inside the index of a subscript, or among the arguments of a
    call that is no builtin, before the statement it is part of ends."""
    child, parent = node, parents.get(id(node))
    while parent is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.Subscript) and child is parent.slice:
            return True
        if isinstance(parent, ast.Call) and child is not parent.func and _own_call(parent):
            return True
        child, parent = parent, parents.get(id(parent))
    return False


def _own_call(call: ast.Call) -> bool:
    name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
    return name not in BUILTINS
