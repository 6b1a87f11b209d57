"""Reference computations remembered within a search: a layer's search computes its attention again
for every reading of its weights (FFN mapping, activation, placement, ...) under every set of mistakes,
though most readings hand the attention the same weights, inputs and mistakes. Inside `remembering()`
a function decorated with `remembered` computes once per distinct call and answers again after.

A call is keyed by what it reads: each tensor argument by its storage, shape, strides, dtype and
version counter (an in-place change makes it another key), each dataclass by its fields, anything
else by its value (it must be hashable). The memo holds the arguments too, so no storage it keys by is
freed and reused while it lives. The reference functions never write into their results, so an answer
handed out twice is safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from torch import Tensor

_memo: dict[Any, tuple[Any, Any]] | None = None  # key -> (what it keys by, kept alive; the answer)
_fields: dict[int, tuple[Any, Any]] = {}  # id of a dataclass keyed -> (it, kept alive; its key)

F = TypeVar("F", bound=Callable[..., Any])
PLAIN = frozenset({bool, int, float, str, type(None), frozenset})  # keyed by their value, as they are
NO_KWARGS = (list, ())  # the key of a call's keyword arguments where it has none


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """Within the block, each call of a `remembered` function is computed once; forgotten after."""
    global _memo, _fields
    outer, _memo, _fields = (_memo, _fields), {}, {}
    try:
        yield
    finally:
        _memo, _fields = outer


def _key(value: Any, held: list[Any]) -> Any:
    """What a call reads of one argument: a tensor's storage and view, a dataclass's fields (keyed once
    for the memo's life: a search builds its weights and never changes them), else the value itself;
    every tensor and dataclass keyed is kept in `held`. A search keys tens of thousands of calls: the
    commonest arguments are tested first, a dataclass already keyed is found by its id."""
    if type(value) in PLAIN:  # most arguments of a search: its flags, sizes and switches
        return value
    if isinstance(value, Tensor):
        held.append(value)
        return Tensor, value.data_ptr(), value.shape, value.stride(), value.dtype, value._version
    if isinstance(value, (tuple, list)):
        return type(value), tuple([_key(v, held) for v in value])
    known = _fields.get(id(value))  # its entry holds it alive: no other object has its id meanwhile
    if known is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = tuple([_key(v, held) for v in vars(value).values()])
        known = _fields[id(value)] = value, (type(value), fields)
    if known is None:
        return value
    held.append(value)
    return known[1]


def _call_key(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
              ) -> tuple[Any, list[Any]] | None:
    """A call's key and the tensors it keys by; None where it cannot be keyed (an inference tensor
    keeps no version counter; an unhashable value)."""
    held: list[Any] = []
    try:
        key = fn, _key(args, held), _key(sorted(kwargs.items()), held) if kwargs else NO_KWARGS
        hash(key)
    except (RuntimeError, TypeError):
        return None
    return key, held


def remembered(fn: F) -> F:
    """`fn` computed once per distinct call inside `remembering()`, as it is outside."""
    @functools.wraps(fn)
    def remembering_fn(*args: Any, **kwargs: Any) -> Any:
        keyed = _call_key(fn, args, kwargs) if _memo is not None else None
        if keyed is None:
            return fn(*args, **kwargs)
        key, held = keyed
        if key not in _memo:
            _memo[key] = held, fn(*args, **kwargs)
        return _memo[key][1]
    return remembering_fn  # type: ignore[return-value]
