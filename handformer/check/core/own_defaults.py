"""The values a learner's file gives its settings, by name, read from its source: what a namespace
handed to its code answers where check has no size of that name (`args.grad_clip` of an argparse
`add_argument('--grad_clip', default=1.0)`, `config.type_vocab_size` of the file's own
`argparse.Namespace(type_vocab_size=2, ...)`).

A name's value is the first literal (a number, a string, True or False) the file writes for it, in the
order of WRITTEN: an argparse default (under its `dest=` when it has one), a field, an argument's
default or a keyword (`min_p: float = 0.05`, `heads=8`, `Config(dropout=0.1)`), a dict's key
(`{"lr": 3e-4}`), a module constant (`GRAD_CLIP = 1.0` answers `grad_clip`). None is no value.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import re
import sys
from typing import Any

from handformer.check.core.source import config_reads, source_text

# a literal ast.literal_eval reads: a number, True, False, a string without escapes
VALUE = (r"""(?P<value>-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|True|False|'[^'\\\n]*'|"[^"\\\n]*")"""
         r"(?=\s*[,)}\n#])")  # followed by what ends a value
NAME, TYPED = r"(?P<name>\w+)", r"\s*(?::\s*[\w.\[\], ]+)?=\s*"  # a name; `: float =` or `=`
# where a file writes a setting's value, in the order they are read
WRITTEN = (
    rf"""add_argument\([^)]*?\bdest\s*=\s*['"]{NAME}['"][^)]*?\bdefault\s*=\s*{VALUE}""",
    rf"""add_argument\([^)]*?\bdefault\s*=\s*{VALUE}[^)]*?\bdest\s*=\s*['"]{NAME}['"]""",
    rf"""add_argument\(\s*['"]-*(?:[\w-]*['"]\s*,\s*['"]-*)?(?P<name>[\w-]+)['"][^)]*?\bdefault\s*=\s*{VALUE}""",
    rf"(?m)^\s*{NAME}{TYPED}{VALUE}", rf"[(,]\s*{NAME}{TYPED}{VALUE}", rf"""['"]{NAME}['"]\s*:\s*{VALUE}""",
    rf"""getattr\(\s*[\w.]+\s*,\s*['"]{NAME}['"]\s*,\s*{VALUE}""")  # fairseq's getattr(args, "x", False)
# a setting read as a condition: `if args.normalize_before`, `... if cfg.use_bias else`, or the attribute
# it is kept in (`self.pre = args.normalize_before` and then `if self.pre`)
CONDITION = re.compile(r"\bif\s+(?:not\s+)?(?:\w+\.)*(\w+)")
KEPT = re.compile(r"(?m)^\s*(?:self\.)?(\w+)\s*=\s*\w+\.(\w+)\s*$")


@functools.lru_cache(maxsize=16)
def _file_defaults(source: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pattern in WRITTEN:
        for match in re.finditer(pattern, source):
            found.setdefault(match["name"].replace("-", "_").lower(), ast.literal_eval(match["value"]))
    return found


def own_defaults(obj: Any) -> dict[str, Any]:
    """Each setting's name (lower case) -> the value the file that defines `obj` gives it (see the
    module's docstring); empty where that file has no source."""
    return _file_defaults(source_text(sys.modules.get(getattr(obj, "__module__", ""), None)))


def flags(obj: Any) -> frozenset[str]:
    """The settings (lower case) the file that defines `obj` reads as a condition, directly or through
    the attribute it keeps one in: a switch that a namespace answers False where the file gives it no
    value (fairseq's args.encoder_normalize_before: post-norm, the paper's)."""
    source = source_text(sys.modules.get(getattr(obj, "__module__", ""), None)).lower()
    read, kept = set(CONDITION.findall(source)), dict(KEPT.findall(source))
    return frozenset(read | {kept[held] for held in read & kept.keys()})


def read_fields(fn: Any, name: str) -> set[str]:
    """The attributes or keys a function reads from its argument `name` as values (`args.lr`,
    `cfg["grad_clip"]`); none where it calls one of its methods (`optimizer.step()`: an object of
    behaviour, not of settings)."""
    calls = re.search(rf"\b{re.escape(name)}\.\w+\s*\(", source_text(fn))
    return set() if calls else set().union(*config_reads(fn, name))  # read as the configs' are


class Keyed:
    """What makes a settings class answer its fields by key too: `cfg["grad_clip"]`, `cfg.get("beta")`
    read the field of that name (a step handed a dict of settings)."""

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __contains__(self, key: str) -> bool:
        return hasattr(self, key)


@functools.lru_cache(maxsize=64)
def settings_class(fn: Any, name: str) -> type | None:
    """A dataclass of the settings `fn` reads from its argument `name` (its fields, each at the value
    the file gives it: own_defaults), where the file gives every one a value; None where it gives
    none to one, or `fn` reads none."""
    fields, values = read_fields(fn, name), own_defaults(fn)
    given = {f: values.get(f.lower()) for f in sorted(fields)}
    fresh = functools.partial(functools.partial, copy.deepcopy)  # a list a field holds stays each call's own
    made = [(f, type(v), dataclasses.field(default_factory=fresh(v))) for f, v in given.items()]
    complete = all((given, None not in given.values()))  # it reads some, and each has a value
    return dataclasses.make_dataclass(f"{name}_settings", made, bases=(Keyed,)) if complete else None
