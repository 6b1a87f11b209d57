"""An argument a function reads only settings off (`group_advantages(rewards, cfg)` reading
`cfg.group_size`): where no name check knows says what to hand it, it is handed an object that
answers every attribute the function reads. Each attribute whose name has a role of the kind
(`group_size`: the group) holds check's value for that role; the rest hold the file's own: an object
of the file's one class that holds them all (its dataclass `Config()`) at its defaults, else a
namespace at the values the file gives those names. An attribute with neither leaves the argument
unfilled (NOT CHECKED, as before). The report names what was handed.
"""

from __future__ import annotations

import re
import types
from typing import Any

from handformer.check.core.defaults import quietly
from handformer.check.core.options_object import _defaults, options_class
from handformer.check.core.own_defaults import Keyed, own_defaults, read_fields
from handformer.check.core.result import Text, text


class Held(types.SimpleNamespace, Keyed):
    """The namespace handed: it answers by key too (`cfg["group_size"]`)."""


def role_of(name: str, roles: dict[str, str]) -> str | None:
    """The first role whose words (a regular expression) the name holds."""
    return next((role for role, words in roles.items() if re.search(words, name, re.I)), None)


def settings_object(fn: Any, name: str, roles: dict[str, str], given: dict[str, Any]) -> Any:
    """The object for fn's argument `name` (see the module's docstring), or None where fn reads no
    attribute off it or one attribute has no value check can give."""
    attrs = read_fields(fn, name)
    ours = {a: given[role_of(a, roles)] for a in attrs if role_of(a, roles) in given}
    cls = options_class(fn, name)
    if cls is not None:
        return quietly(lambda: cls(**{**_defaults(cls), **ours}), (TypeError, ValueError))
    theirs = {a: own_defaults(fn).get(a.lower()) for a in attrs - ours.keys()}
    held = {**theirs, **ours}
    return Held(**held) if attrs and None not in held.values() else None


def roles_held(fn: Any, name: str, roles: dict[str, str]) -> set[str]:
    """The roles the attributes fn reads off its argument `name` stand for."""
    return {role_of(a, roles) for a in read_fields(fn, name)} - {None}


def settings_note(fn: Any, name: str, obj: Any, roles: dict[str, str], given: dict[str, Any]) -> Text:
    """What fn's argument `name` was handed: its class and each attribute read set to check's value."""
    ours = sorted(f"{a} = {getattr(obj, a)!r}" for a in read_fields(fn, name) if role_of(a, roles) in given)
    held = type(obj).__name__ if not isinstance(obj, types.SimpleNamespace) else "a namespace"
    held_zh = type(obj).__name__ if not isinstance(obj, types.SimpleNamespace) else "一个命名空间"
    said = ", ".join(ours) or "none"
    return text(f"{name}: handed {held} at your file's values, with check's where it reads a role of its own "
                f"({said})",
                f"{name}：传入的是 {held_zh}，取你的文件里的值，check 有对应设置处取 check 的值（{said}）")
