"""What a loop reads off the objects it is handed, carried by check's stand-ins: the attribute chains
its code reads from an argument (`model.config.block_size`, `model.max_seq_len`, `self.args.eos_token_id`),
read from its source (AST), each given to the stand-in it is handed where the stand-in has none.

A chain's value is the size check drives the loop at, by the role its last name plays (a block size:
the longest context the stand-in runs; the vocabulary; a count, an EOS or a padding id where the run
sets one; a chain the loop counts its steps by, `for _ in range(self.args.max_completion_length)`, is
its count); else the value the learner's file gives that name (own_defaults.py). A chain with neither
is left off: the stand-in's own error says which (NOT CHECKED, as before).
"""

from __future__ import annotations

import ast
import functools
import textwrap
import types
from typing import Any

from torch import nn

from handformer.check.core.argument_names import CONTEXT_NAMES, COUNT_NAMES, EOS_NAMES, PAD_NAMES
from handformer.check.core.own_defaults import own_defaults
from handformer.check.core.result import Text, text
from handformer.check.core.source import source_text

# the roles a chain's last name plays, by name; "count" is also read from the code's form (`counted`)
ROLE_NAMES = {"context": CONTEXT_NAMES + ("max_len", "n_ctx", "n_positions", "max_position_embeddings",
                                          "seq_len", "max_seq_length", "sequence_length"),
              "vocab": ("vocab_size", "n_vocab", "vocab", "num_embeddings"),
              "count": COUNT_NAMES, "eos": EOS_NAMES, "pad": PAD_NAMES, "device": ("device",)}
FIXED = {"device": "cpu"}  # where every run of check is


def _chain(node: ast.Attribute) -> tuple[str, tuple[str, ...]] | None:
    """(the root name, its attributes) of `root.a.b`; None where the root is not a plain name."""
    names: list[str] = []
    while isinstance(node, ast.Attribute):
        names.insert(0, node.attr)
        node = node.value  # type: ignore[assignment]
    return (node.id, tuple(names)) if isinstance(node, ast.Name) else None


@functools.lru_cache(maxsize=256)
def _reads(source: str) -> tuple[frozenset[tuple[str, tuple[str, ...]]], frozenset[tuple[str, ...]]]:
    """(every chain read as a value, the chains a `for` loop counts by) in one function's source. A
    chain that is called (`model.step(...)`, `self.model(ids)`) is a method, not read; its own prefix
    is (`model.config.block_size` is one chain, not also `model.config`)."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return frozenset(), frozenset()
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    chains = {c for n in ast.walk(tree) if isinstance(n, ast.Attribute) and id(n) not in inner | called
              and isinstance(n.ctx, ast.Load) and (c := _chain(n))}
    loops = [n.iter for n in ast.walk(tree) if isinstance(n, ast.For) and isinstance(n.iter, ast.Call)]
    ranges = [call.args[-1] for call in loops if getattr(call.func, "id", "") == "range" and call.args]
    counted = {c for r in ranges if isinstance(r, ast.Attribute) and (c := _chain(r))}
    return frozenset(chains), frozenset(counted)


def chains_read(fn: Any, name: str) -> list[tuple[str, ...]]:
    """The attribute chains `fn` reads off its argument `name`, in a stable order."""
    chains, _ = _reads(source_text(fn))
    return sorted(attrs for root, attrs in chains if root == name)


def _role(fn: Any, name: str, attrs: tuple[str, ...]) -> str | None:
    if (name, attrs) in _reads(source_text(fn))[1]:
        return "count"
    return next((role for role, names in ROLE_NAMES.items() if attrs[-1].lower() in names), None)


def _value(fn: Any, name: str, attrs: tuple[str, ...], sizes: dict[str, Any]) -> Any:
    """The value a chain is carried at: the run's size of its role, else the file's value of its name."""
    role = _role(fn, name, attrs)
    sizes = {**FIXED, **sizes}
    return sizes[role] if role in sizes else own_defaults(fn).get(attrs[-1].lower())


def carry(obj: Any, fn: Any, name: str, sizes: dict[str, Any]) -> list[tuple[str, Any]]:
    """Give the stand-in `obj`, handed to `fn` as its argument `name`, each chain `fn` reads off it that
    it lacks (intermediate objects as namespaces; into a namespace it has, never into another object of
    its own); `sizes` are the run's values by role. The (dotted chain, value) pairs carried."""
    carried = []
    for attrs in chains_read(fn, name):
        holder, value = obj, _value(fn, name, attrs, sizes)
        for attr in attrs[:-1]:
            if not hasattr(holder, attr) and value is not None:
                setattr(holder, attr, types.SimpleNamespace())
            holder = getattr(holder, attr, None)
            if not isinstance(holder, types.SimpleNamespace):
                break
        else:
            if value is not None and not hasattr(holder, attrs[-1]):
                setattr(holder, attrs[-1], value)
                carried.append((".".join((name, *attrs)), value))
    return carried


def carried_note(pairs: list[tuple[str, Any]]) -> list[Text]:
    """The note that says which chains the stand-in was given, and at what."""
    said = ", ".join(f"{chain} = {value!r}" for chain, value in pairs)
    return [text(f"your code reads {said} off the model it is handed: check's stand-in carries what it reads "
                 "(a size at the one check runs, else the value your file gives that name)",
                 f"你的代码从交给它的模型上读取 {said}：检查程序的替身带上了这些属性（尺寸取检查运行时的值，"
                 "其余取你的文件给这个名字的值）")] * bool(pairs)


def methods_called(fn: Any, name: str, known: Any = None) -> list[str]:
    """The methods `fn` calls on its argument `name` (`model.step(token, t, states)`) that an object of
    the class `known` (nn.Module by default: eval, parameters, ...) does not have: what only a model
    of the learner's own class can answer."""
    try:
        tree = ast.parse(textwrap.dedent(source_text(fn)))
    except SyntaxError:
        return []
    calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    chains = [c[1] for func in calls if (c := _chain(func)) and c[0] == name and len(c[1]) == 1]
    return sorted({attrs[0] for attrs in chains} - set(dir(known or nn.Module)) - {"forward"})
