"""A component built the way the learner's own code builds it, where its constructor takes modules
check cannot make up (torchtune's MultiHeadAttention(q_proj=nn.Linear(...), ...), the Annotated
Transformer's EncoderLayer(size, self_attn, feed_forward, dropout) with an FFN written inline as an
nn.Sequential): the arguments a host of the learner's file hands it, a builder function (torchtune's
llama3_tiny()) or a model class whose constructor calls it, built at check's sizes; check builds
the component with them where it cannot fill an argument itself.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch.nn as nn

from handformer.check.core.source import code_text, function_nodes

HOSTED = "hosted"  # in the sizes a host is built with: no host is searched for the host's own parts
# the sizes a host takes that no component is built with (a model's vocabularies, its depth)
HOST_SIZES = {"src_vocab": 29, "tgt_vocab": 31, "n_layers": 2, HOSTED: True}


def host_arguments(cls: type, sizes: dict[str, Any], build: Callable[[Any, dict[str, Any]], Any],
                   keys: Callable[[Any], dict[str, str | None]]) -> dict[str, Any] | None:
    """The arguments the first of `cls`'s hosts that builds at `sizes` hands to `cls` (`build`
    matches a host's arguments, `keys` says which size each stands for: a builder that takes no
    model width has its own sizes, and is passed over); None where none does."""
    hosted = {**HOST_SIZES, **sizes}
    for host in [h for h in hosts(cls) if HOSTED not in sizes and "d_model" in keys(h).values()]:
        calls = _calls_building(host, cls, hosted, build)
        if calls:
            return calls[0]
    return None


def _calls_building(host: Any, cls: type, sizes: dict[str, Any], build: Callable[..., Any],
                    ) -> list[dict[str, Any]]:
    """The arguments of each call of cls(...) while `host` is built, by name; none where it does not
    build here (a host that raises is passed over, as if not written)."""
    calls: list[dict[str, Any]] = []
    own, init = cls.__dict__.get("__init__"), cls.__init__
    signature = inspect.signature(init)

    def recording(self: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(dict(list(signature.bind(self, *args, **kwargs).arguments.items())[1:]))
        init(self, *args, **kwargs)

    cls.__init__ = recording  # type: ignore[misc]
    try:
        if type(build(host, sizes)) is cls:  # its factory (make_model): the model's runner builds with it
            calls.clear()
    except Exception:  # (a call that does not fit its signature raises in `bind`, as in their init)
        calls.clear()
    finally:
        if own is None:  # its parent's, inherited
            del cls.__init__
        else:
            cls.__init__ = own  # type: ignore[misc]
    return calls


def hosts(cls: type) -> list[Any]:
    """The learner's builder functions (those that return a call) and module classes, of the file
    that defines `cls`, whose code calls `cls` by name: builders first, as the learner's own recipe."""
    module = getattr(sys.modules.get(cls.__module__), "__dict__", {})
    found = [obj for obj in module.values() if getattr(obj, "__module__", None) == cls.__module__
             and f"{cls.__name__}(" in code_text(obj) and _builds(obj)]
    return sorted(found, key=inspect.isclass)


def _builds(obj: Any) -> bool:
    """A module class, or a function whose `return` hands back a call (a constructor's): a builder,
    not a training loop."""
    if isinstance(obj, type):
        return issubclass(obj, nn.Module)
    return any(isinstance(n, ast.Return) and isinstance(n.value, ast.Call) for n in function_nodes(obj))
