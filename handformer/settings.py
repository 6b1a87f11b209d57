"""Typed setting checkers: one home for "is this an integer (not a bool)", "a positive integer",
"a number >= 0", "one of these", with errors that name the field and say what it must be.

`True` is an `int` to Python, so every check of a count or a number rules bools out first: a
setting written `top_k: true` is a mistake, not a 1.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def is_int(value: Any) -> bool:
    """An integer, and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or a float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def int_at_least(name: str, value: Any, low: int) -> int:
    """`value` if it is an integer >= low; else a ValueError naming `name`."""
    if not is_int(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def positive_int(name: str, value: Any) -> int:
    """`value` if it is an integer > 0; else a ValueError naming `name`."""
    if not is_int(value) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def non_negative_int(name: str, value: Any) -> int:
    """`value` if it is an integer >= 0; else a ValueError naming `name`."""
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def non_negative_float(name: str, value: Any) -> float:
    """`value` if it is a number >= 0 (NaN is not); else a ValueError naming `name`."""
    if not is_number(value) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return value


def choice(name: str, value: Any, options: Collection[Any]) -> Any:
    """`value` if it is one of `options`; else a ValueError naming `name` and listing them."""
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value
