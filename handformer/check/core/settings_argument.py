"""An argument a function reads only settings off (`group_advantages(rewards, cfg)` reading
`cfg.group_size`): where no name check knows says what to hand it, it is handed an object that
answers every attribute the function reads. Each attribute whose name has a role of the kind
(`group_size`: the group) holds check's value for that role; the rest hold the value the file gives
that name (a dataclass field's default, an argparse default: own_defaults.py). The object is the
file's one class that holds them all (its dataclass `Config`), else a namespace. An attribute with no
value anywhere leaves the argument unfilled (NOT CHECKED). The report names what was handed.
"""

from __future__ import annotations

import re
import types
from typing import Any

from handformer.check.core.defaults import quietly
from handformer.check.core.options_object import options_class
from handformer.check.core.own_defaults import Keyed, own_defaults, read_fields
from handformer.check.core.result import Text, text


class Held(types.SimpleNamespace, Keyed):
    """The namespace handed: it answers by key too (`cfg["group_size"]`)."""


def role_of(name: str, roles: dict[str, str]) -> str | None:
    """The first role whose words (a regular expression) the name holds."""
    return next(filter(lambda role: re.search(roles[role], name, re.I), roles), None)


def settings_object(fn: Any, name: str, roles: dict[str, str], given: dict[str, Any]) -> Any:
    """The object for fn's argument `name` (see the module's docstring), or None where fn reads no
    attribute off it or one attribute has no value check can give."""
    own = own_defaults(fn)
    values = {a: given.get(role_of(a, roles), own.get(a.lower())) for a in read_fields(fn, name)}
    made = quietly(lambda: (options_class(fn, name) or Held)(**values), (TypeError, ValueError))
    return made if None not in [*values.values(), values or None] else None


def roles_held(fn: Any, name: str, roles: dict[str, str]) -> set[str]:
    """The roles the attributes fn reads off its argument `name` stand for."""
    return {role_of(a, roles) for a in read_fields(fn, name)} - {None}


def settings_note(fn: Any, name: str, obj: Any, roles: dict[str, str], given: dict[str, Any]) -> Text:
    """What fn's argument `name` was handed: its class and each attribute read set to check's value."""
    ours = sorted(f"{a} = {getattr(obj, a)!r}" for a in read_fields(fn, name) if role_of(a, roles) in given)
    held = {Held: ("a namespace", "一个命名空间")}.get(type(obj), (type(obj).__name__,) * 2)
    said = ", ".join(ours) or "none"
    return text(f"{name}: handed {held[0]} at your file's values, with check's where it reads a role of its "
                f"own ({said})",
                f"{name}：传入的是 {held[1]}，取你的文件里的值，check 有对应设置处取 check 的值（{said}）")
