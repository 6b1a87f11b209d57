"""The values a learner's file gives its settings, by name, read from its source: what a namespace
handed to its code answers where check has no size of that name (`args.grad_clip` of an argparse
`add_argument('--grad_clip', default=1.0)`, `config.type_vocab_size` of the file's own
`argparse.Namespace(type_vocab_size=2, ...)`).

A name's value is the first literal the file writes for it, declarations first: a class body's field
(a dataclass's `min_p: float = 0.05`), an argument's default (`def __init__(self, heads=8)`), an
argparse default; then a keyword of a call (`Config(dropout=0.1)`) or a key of a dict literal
(`{"lr": 3e-4}`); then a module constant (`GRAD_CLIP = 1.0` answers `grad_clip`). A None is no value.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

from handformer.check.core.source import function_nodes, parsed_file

Pairs = Iterator[tuple[str, ast.AST]]


def _literal(node: ast.AST | None) -> Any:
    """The value a literal node writes (numbers, strings, tuples, lists and dicts of them); None for
    any other node."""
    try:
        return ast.literal_eval(node) if node is not None else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _class_fields(node: ast.ClassDef) -> Pairs:
    for stmt in node.body:
        targets = getattr(stmt, "targets", [getattr(stmt, "target", None)])
        yield from ((t.id, stmt.value) for t in targets if isinstance(t, ast.Name) and stmt.value)


def _argument_defaults(node: ast.FunctionDef) -> Pairs:
    args = node.args
    positional = args.posonlyargs + args.args
    yield from zip((a.arg for a in positional[len(positional) - len(args.defaults):]), args.defaults)
    yield from ((a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)


def _argparse_default(node: ast.Call) -> Pairs:
    """parser.add_argument('--grad-clip', default=1.0) (or dest='grad_clip'): grad_clip."""
    if getattr(node.func, "attr", "") != "add_argument":
        return
    keywords = {k.arg: k.value for k in node.keywords}
    flags = [str(_literal(a)) for a in node.args if isinstance(_literal(a), str)]
    dest = _literal(keywords.get("dest")) or next((f for f in flags if f.startswith("--")), flags[:1] or [""])
    yield str(dest).lstrip("-").replace("-", "_"), keywords.get("default")


def _call_keywords(node: ast.Call) -> Pairs:
    yield from ((k.arg, k.value) for k in node.keywords if k.arg)


def _dict_entries(node: ast.Dict) -> Pairs:
    yield from ((k.value, v) for k, v in zip(node.keys, node.values)
                if isinstance(k, ast.Constant) and isinstance(k.value, str))


def _constants(node: ast.Module) -> Pairs:
    for stmt in node.body:
        targets = [t for t in getattr(stmt, "targets", []) if isinstance(t, ast.Name)]
        yield from ((t.id.lower(), stmt.value) for t in targets)


# the places a file writes a setting's value, by the node that holds them, in the order they are read
READERS: tuple[tuple[type, Callable[[Any], Pairs]], ...] = (
    (ast.ClassDef, _class_fields), (ast.FunctionDef, _argument_defaults), (ast.Call, _argparse_default),
    (ast.Call, _call_keywords), (ast.Dict, _dict_entries), (ast.Module, _constants))


@functools.lru_cache(maxsize=16)
def _file_defaults(filename: str) -> dict[str, Any]:
    try:
        nodes = list(ast.walk(parsed_file(filename)))
    except (OSError, SyntaxError, ValueError):
        return {}
    found: dict[str, Any] = {}
    for kind, read in READERS:
        for name, node in (pair for n in nodes if isinstance(n, kind) for pair in read(n)):
            value = _literal(node)
            if value is not None:
                found.setdefault(name, value)
    return found


def own_defaults(obj: Any) -> dict[str, Any]:
    """Each setting's name -> the value the file that defines `obj` gives it (see the module's
    docstring); empty where that file cannot be read."""
    filename = getattr(sys.modules.get(getattr(obj, "__module__", ""), None), "__file__", None)
    return _file_defaults(filename) if filename else {}


def read_fields(fn: Any, name: str) -> set[str]:
    """The attributes a function reads from its argument `name` as values (`args.lr`, not a method
    it calls: `optimizer.step()`); empty where it calls one (an object of behaviour, not settings)."""
    nodes = function_nodes(fn)
    reads = [n for n in nodes if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == name]
    called = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
    return set() if any(id(n) in called for n in reads) else {n.attr for n in reads}


@functools.lru_cache(maxsize=64)
def settings_class(fn: Any, name: str) -> type | None:
    """A dataclass of the settings `fn` reads from its argument `name` (its fields, each at the value
    the file gives it: own_defaults), where the file gives every one a value; None where it gives
    none to one, or `fn` reads none."""
    fields, values = read_fields(fn, name), own_defaults(fn)
    if not fields or not fields <= set(values):
        return None
    fresh = {f: functools.partial(copy.deepcopy, values[f]) for f in fields}  # a list stays the call's own
    made = [(f, type(values[f]), dataclasses.field(default_factory=fresh[f])) for f in sorted(fields)]
    return dataclasses.make_dataclass(f"{name}_settings", made)
