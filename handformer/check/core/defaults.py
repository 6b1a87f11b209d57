"""Helpers for patterns the grader repeats: an optional argument, or what stands for it where none
was handed (a default built at the call: a fresh dict, a mask that hides nothing), or a step taken only
on a value there is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def given(value: T | None, otherwise: T) -> T:
    """`value`, or `otherwise` where it is None (a falsy value such as 0 or an empty list is kept)."""
    return otherwise if value is None else value


def then(value: T | None, act: Callable[[T], Any]) -> Any:
    """`act(value)`, or None where `value` is None (nothing to act on: a part the learner's code lacks, a
    call that gave nothing); `act` is not called then."""
    return None if value is None else act(value)


def keyword(name: str | None, value: T) -> dict[str, T]:
    """The keyword argument {name: value} to hand a call, or none where the learner's code has no
    such parameter (`name` None or empty)."""
    return {name: value} if name else {}


def quietly(run: Callable[[], T], caught: type[BaseException] | tuple[type[BaseException], ...] = Exception,
            otherwise: Any = None) -> T | Any:
    """What `run()` gives; `otherwise` (None) when it raises one of `caught` (the learner's code, or a
    reading of it that does not apply: nothing to say from it)."""
    try:
        return run()
    except caught:  # noqa: BLE001 - their code, or a reading that does not apply: nothing found
        return otherwise
