"""One helper for a pattern the grader repeats: an optional argument, or what stands for it where none
was handed (a default built at the call: a fresh dict, a mask that hides nothing)."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def given(value: T | None, otherwise: T) -> T:
    """`value`, or `otherwise` where it is None (a falsy value such as 0 or an empty list is kept)."""
    return otherwise if value is None else value
