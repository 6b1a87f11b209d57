"""A component built the way the learner's own code builds it, where its constructor takes modules
check cannot make up (torchtune's MultiHeadAttention(q_proj=nn.Linear(...), ...), the Annotated
Transformer's EncoderLayer(size, self_attn, feed_forward, dropout) with an FFN written inline as an
nn.Sequential): the arguments a host of the learner's file hands it, a builder function (torchtune's
llama3_tiny()) or a model class whose constructor calls it, built at check's sizes; check builds
the component with them where it cannot fill an argument itself.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch.nn as nn

from handformer.check.core.source import code_text, function_nodes

_HOSTING: set[Any] = set()  # the classes whose host is being built (a host's own host is not searched)
# the sizes a host takes that no component is built with (a model's vocabularies, its depth)
HOST_SIZES = {"src_vocab": 29, "tgt_vocab": 31, "n_layers": 2}


def host_arguments(cls: type, sizes: dict[str, Any], build: Callable[[Any, dict[str, Any]], Any],
                   keys: Callable[[Any], dict[str, str | None]]) -> dict[str, Any] | None:
    """The arguments the first of `cls`'s hosts that builds at `sizes` hands to `cls` (`build`
    matches a host's arguments, `keys` says which size each stands for); None where none does."""
    if cls in _HOSTING:
        return None
    with _hosting(cls):
        for host in hosts(cls):
            if "d_model" not in keys(host).values():  # a builder with its own fixed sizes
                continue
            with _recorded(cls) as calls:
                try:
                    build(host, {**HOST_SIZES, **sizes})
                except Exception:  # a host that does not build here is passed over, as if not written
                    continue
            if calls:
                return calls[0]
    return None


@contextlib.contextmanager
def _recorded(cls: type) -> Iterator[list[dict[str, Any]]]:
    """The arguments of each call of cls(...) while the block runs, by name (a subclass's left out)."""
    calls: list[dict[str, Any]] = []
    own, init = cls.__dict__.get("__init__"), cls.__init__
    signature = inspect.signature(init)

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        with contextlib.suppress(TypeError):  # a call that does not fit raises in the learner's own init
            if type(self) is cls:
                calls.append(dict(list(signature.bind(self, *args, **kwargs).arguments.items())[1:]))
        init(self, *args, **kwargs)

    cls.__init__ = recording  # type: ignore[misc]
    try:
        yield calls
    finally:
        if own is None:
            del cls.__init__
        else:
            cls.__init__ = own  # type: ignore[misc]


@contextlib.contextmanager
def _hosting(cls: type) -> Iterator[None]:
    _HOSTING.add(cls)
    try:
        yield
    finally:
        _HOSTING.discard(cls)


def hosts(cls: type) -> list[Any]:
    """The learner's builder functions (those that return a call) and module classes, of the file
    that defines `cls`, whose code calls `cls` by name: builders first, as the learner's own recipe."""
    module = sys.modules.get(cls.__module__)
    own = [obj for obj in vars(module).values() if getattr(obj, "__module__", None) == cls.__module__
           and obj is not cls] if module else []
    builders = [f for f in own if inspect.isfunction(f) and _returns_call(f) and _calls(f, cls)]
    models = [c for c in own if inspect.isclass(c) and issubclass(c, nn.Module) and _calls(c, cls)]
    return builders + models


def _calls(obj: Any, cls: type) -> bool:
    return f"{cls.__name__}(" in code_text(obj)


def _returns_call(fn: Any) -> bool:
    """A function whose `return` hands back a call (a constructor's): a builder, not a training loop."""
    return any(isinstance(n, ast.Return) and isinstance(n.value, ast.Call) for n in function_nodes(fn))
