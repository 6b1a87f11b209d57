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
import collections
import functools
import itertools
import re
import types
from typing import Any

from torch import nn

from handformer.check.core.argument_names import CONTEXT_NAMES, COUNT_NAMES, EOS_NAMES, MODEL_NAMES, PAD_NAMES
from handformer.check.core.context import forward_names
from handformer.check.core.own_defaults import own_defaults
from handformer.check.core.result import Text, text
from handformer.check.core.source import function_nodes

# the roles a chain's last name plays, by name; "count" is also read from the code's form (`_reads`)
ROLE_NAMES = {"context": CONTEXT_NAMES + ("max_len", "n_ctx", "n_positions", "max_position_embeddings",
                                          "seq_len", "seq_length", "max_seq_length", "sequence_length",
                                          "max_sequence_length"),
              "vocab": ("vocab_size", "n_vocab", "vocab", "num_embeddings"),
              "count": COUNT_NAMES, "eos": EOS_NAMES, "pad": PAD_NAMES, "device": ("device",)}
ROLE_OF = {name: role for role, names in ROLE_NAMES.items() for name in names}
FIXED = {"device": "cpu"}  # where every run of check is
MISSING = object()


def _nodes(fn: Any) -> dict[type, list[Any]]:
    """The nodes of a function's source, by type (none where it does not parse)."""
    nodes: dict[type, list[Any]] = collections.defaultdict(list)
    for node in function_nodes(fn):
        nodes[type(node)].append(node)
    return nodes


@functools.lru_cache(maxsize=256)
def _reads(fn: Any) -> tuple[str, frozenset[str], str]:
    """(the chains read as values, one a line; what each `for` loop iterates over; the chains called,
    one a line), as written in one function's source. A chain is the longest one written
    (`model.config.block_size`, not also `model.config`); one that is called (`model.step(...)`) is a
    method, not a value."""
    nodes = _nodes(fn)
    inner, called = {id(n.value) for n in nodes[ast.Attribute]}, {id(n.func) for n in nodes[ast.Call]}
    chains = collections.defaultdict(set)  # by (inside a longer one, called)
    for node in nodes[ast.Attribute]:
        chains[id(node) in inner, id(node) in called].add(ast.unparse(node))
    iterated = frozenset(ast.unparse(n.iter) for n in nodes[ast.For])
    return "\n".join(sorted(chains[False, False])), iterated, "\n".join(sorted(chains[False, True]))


def chains_read(fn: Any, name: str) -> list[tuple[str, ...]]:
    """The attribute chains `fn` reads off its argument `name`, in a stable order."""
    found = re.findall(rf"(?m)^{re.escape(name)}((?:\.[A-Za-z_]\w*)+)$", _reads(fn)[0])
    return [tuple(chain.split(".")[1:]) for chain in found]


def _value(fn: Any, name: str, attrs: tuple[str, ...], sizes: dict[str, Any]) -> Any:
    """The value a chain is carried at: the run's size of its role, else the file's value of its name."""
    counted = f"range({'.'.join((name, *attrs))})" in _reads(fn)[1]
    role = {True: "count"}.get(counted, ROLE_OF.get(attrs[-1].lower()))
    return {**FIXED, **sizes}.get(role, own_defaults(fn).get(attrs[-1].lower()))  # (no role: None)


def _holder(obj: Any, attrs: tuple[str, ...]) -> Any:
    """The object at `obj.attrs...`, each one missing made a namespace."""
    for attr in attrs:
        if not hasattr(obj, attr):
            setattr(obj, attr, types.SimpleNamespace())
        obj = getattr(obj, attr)
    return obj


def carry(obj: Any, fn: Any, name: str, sizes: dict[str, Any]) -> list[tuple[str, Any]]:
    """Give the stand-in `obj` (check's own), handed to `fn` as its argument `name`, each chain `fn`
    reads off it that it lacks, intermediate objects as namespaces; `sizes` are the run's values by
    role. The (dotted chain, value) pairs carried."""
    kept = itertools.filterfalse(functools.partial(_through_called, fn, name), chains_read(fn, name))
    valued = [(attrs, _value(fn, name, attrs, sizes)) for attrs in kept]
    missing = [(attrs, v) for attrs, v in valued if v is not None and _at(obj, attrs) is MISSING]
    for attrs, value in missing:
        setattr(_holder(obj, attrs[:-1]), attrs[-1], value)
    return [(".".join((name, *attrs)), v) for attrs, v in missing]


def _through_called(fn: Any, name: str, attrs: tuple[str, ...]) -> bool:
    """Whether a chain passes through an object whose methods `fn` calls (`model.tokenizer.eos_id` where
    it also calls `model.tokenizer.decode(...)`): a tokenizer, not a holder of values, so it is not
    carried as a namespace (the stand-in's missing attribute then says what the loop needs)."""
    called = _reads(fn)[2].splitlines()
    chain = (name, *attrs)
    holders = {".".join(chain[:i]) + "." for i in range(2, len(chain))}
    return any(c.startswith(h) for c in called for h in holders)


def _at(obj: Any, attrs: tuple[str, ...]) -> Any:
    return functools.reduce(lambda o, a: getattr(o, a, MISSING), attrs, obj)


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
    found = re.findall(rf"(?m)^{re.escape(name)}\.([A-Za-z_]\w*)$", _reads(fn)[2])
    return sorted(set(found) - set(dir(known or nn.Module)) - {"forward"})


def model_argument(fn: Any) -> str:
    """The name of the argument a loop is handed its model by: the first of MODEL_NAMES, else its first
    ("" where it takes none). (min keeps the first of equal keys.)"""
    return min([*forward_names(fn), ""], key=lambda n: n.lower() not in MODEL_NAMES)
