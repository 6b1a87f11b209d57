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
from typing import Any

from handformer.check.core.argument_names import COUNT_NAMES, MODEL_NAMES, PROMPT_NAMES, readable_parameters
from handformer.check.core.source import function_nodes

# the calls of Python's own that read a limit without cropping anything by it
BUILTINS = frozenset({"min", "max", "int", "len", "range", "abs", "print", "float", "str", "isinstance"})
NOT_COUNTS = MODEL_NAMES + PROMPT_NAMES + ("self",)
# what bounds a loop's steps: a `while` test, a `for` over range(...)
BOUNDS = {ast.While: lambda node: node.test, ast.For: lambda node: (ast.Pass(), node.iter)[_range(node.iter)]}
# the forms of a limit's read that crop by it: inside a subscript's index, or an argument of a call of
# the file's own; and those that stop at it: compared with, or bounding a range
CROPS = (lambda child, parent: isinstance(parent, ast.Subscript) and child is parent.slice,
         lambda child, parent: isinstance(parent, ast.Call) and child is not parent.func and _own(parent))
STOPS = (lambda child, parent: isinstance(parent, ast.Compare) or _range(parent),)


def counted_parameter(fn: Any) -> str:
    """The parameter a loop counts its steps by where none is named for a count (COUNT_NAMES): the first
    one (an int, or required; not the model or the prompt) that a `for` loop's range(...) or a `while`
    test reads; "" where one is named so, or none is read so."""
    params = readable_parameters(fn)
    named = {p.name.lower() for p in params} & set(COUNT_NAMES)
    # an int default, or none (inspect's `empty`, a class: of type `type`)
    ints = {p.name for p in params if type(p.default) in (int, type)} - set(NOT_COUNTS) - collections(fn)
    if named or not ints:  # no parameter left to find
        return ""
    loops = [node for node in function_nodes(fn) if type(node) in BOUNDS]  # only a loop's bound is walked
    read = [n.id for node in loops for n in _values(BOUNDS[type(node)](node)) if n.id in ints]
    return next(iter(read), "")


def nodes_of(fn: Any, *kinds: type) -> list[Any]:
    """The nodes of fn's source of these kinds."""
    return [n for n in function_nodes(fn) if isinstance(n, kinds)]


def walked(node: ast.AST) -> ast.AST:
    """What a loop walks: the collection handed to enumerate(...) or zip(...), else the node itself."""
    unwraps = getattr(getattr(node, "func", None), "id", "") in ("enumerate", "zip")
    return [node, *getattr(node, "args", []), node][unwraps]


def name_of(node: Any) -> str:
    """The name a node reads ("" for anything but a plain name)."""
    return getattr(node, "id", "")


def collections(fn: Any) -> set[str]:
    """The names a function reads as a collection, never a count: iterated (`for p in params`, in a
    comprehension or through enumerate), indexed (`params[i]`), or measured (`len(params)`)."""
    iterated = [walked(n.iter) for n in nodes_of(fn, ast.For, ast.comprehension)]
    indexed = [n.value for n in nodes_of(fn, ast.Subscript)]
    measured = [[*n.args, None][0] for n in nodes_of(fn, ast.Call) if name_of(n.func) == "len"]
    return set(map(name_of, iterated + indexed + measured)) - {""}


def counted_fields(fn: Any) -> list[str]:
    """The attributes a loop counts its steps by, whatever they are called (`range(request.max_new)`,
    `while len(out) < params.max_tokens`): a settings object's count."""
    bounds = [ast.walk(BOUNDS[type(node)](node)) for node in nodes_of(fn, *BOUNDS)]
    return [n.attr for walk in bounds for n in walk if isinstance(n, ast.Attribute)]


def accumulation_count(fn: Any) -> str:
    """The name a training loop counts its micro-steps by: the bound of a `for` over range(...) whose
    body backpropagates (`.backward()`) and steps nothing (`.step()`): gradient accumulation, whatever
    the count is called; "" where no loop is written so."""
    accumulates = [(_range(n.iter), _calls(n, "backward"), _calls(n, "step")) == (True, True, False)
                   for n in nodes_of(fn, ast.For)]
    bounds = [n.iter.args[:2][-1] for n, yes in zip(nodes_of(fn, ast.For), accumulates) if yes]
    return next(map(name_of, bounds), "")


def _calls(node: ast.AST, attr: str) -> bool:
    """Whether the code under node calls a method `attr` (`loss.backward()`)."""
    return attr in {getattr(getattr(n, "func", None), "attr", "") for n in ast.walk(node)}


def _values(node: ast.AST) -> list[ast.Name]:
    """The names read as values in an expression: not an object whose attribute or item is read
    (`settings.max_tokens` reads max_tokens, not settings)."""
    nodes = list(ast.walk(node))
    held = {id(getattr(n, "value", None)) for n in nodes if isinstance(n, (ast.Attribute, ast.Subscript))}
    return [n for n in nodes if isinstance(n, ast.Name) and id(n) not in held]


def _range(node: ast.AST) -> bool:
    return getattr(getattr(node, "func", None), "id", "") == "range"


def crops_by_limit(fn: Any, names: tuple[str, ...], attrs: tuple[str, ...]) -> bool | None:
    """Whether a loop that reads a context limit (a name in `names`, an attribute in `attrs`: a config's
    .seq_length, where a local seq_len is no limit) crops or stops by it: the limit inside a slice,
    handed to a call of its own, compared with or bounding a range (itself or a name bound from it),
    or an argument or a name bound from it that it never reads (True); read only otherwise (False); None
    where it reads none."""
    nodes = function_nodes(fn)
    parents = {id(child): node for node in nodes for child in ast.iter_child_nodes(node)}
    limits = {ast.Name: (names, "id"), ast.Attribute: (names + attrs, "attr")}
    reads = [n for n in nodes if _limit(n, limits)]
    loads = [n for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    statements = [_chain(n, parents)[1] for n in reads]  # max_len = config.max_position_embeddings: max_len
    targets = [t for statement in statements for t in getattr(statement, "targets", ())]
    bound = {getattr(t, "id", "") for t in targets} - {""}
    # a limit handed as an argument, or bound to a name, that is never read: the crop left out
    taken = {p.name for p in readable_parameters(fn) if p.name.lower() in names}
    unused = (taken | bound) - {n.id for n in loads}
    kept = reads + [n for n in loads if n.id in bound]
    forms = [_reads_as(n, parents, CROPS) for n in reads] + [_reads_as(n, parents, STOPS) for n in kept]
    return {(False, False): None}.get((bool(reads), bool(unused)), bool(unused) or any(forms))


Pairs = list[tuple[ast.AST, ast.AST]]


def _chain(node: ast.AST, parents: dict[int, ast.AST]) -> tuple[Pairs, ast.AST | None]:
    """The (child, parent) pairs from `node` up to the statement that holds it, and that statement."""
    pairs, child, parent = [], node, parents.get(id(node))
    while not isinstance(parent, (ast.stmt, type(None))):
        pairs.append((child, parent))
        child, parent = parent, parents.get(id(parent))
    return pairs, parent


def _reads_as(node: ast.AST, parents: dict[int, ast.AST], forms: tuple[Any, ...]) -> bool:
    """Whether the limit read at `node` is read in one of `forms` before its statement ends."""
    return any(form(child, parent) for child, parent in _chain(node, parents)[0] for form in forms)


def _limit(node: ast.AST, limits: dict[type, tuple[tuple[str, ...], str]]) -> bool:
    """Whether a name or an attribute is a limit's (by its table `limits`)."""
    names, field = limits.get(type(node), ((), "id"))
    return getattr(node, field, "").lower() in names


def _own(call: ast.Call) -> bool:
    return getattr(call.func, "id", getattr(call.func, "attr", "")) not in BUILTINS
