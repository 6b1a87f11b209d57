"""A layer driven through its parent. Where a layer's forward requires arguments that its parent model
computes and hands down (RoFormer's `layer(x, mask, pos_emb)`, a GPT block's `block(x, key_mask)`) and
check's call leaves them out, the parent is built from the learner's own class at check's sizes and run
on token ids of the batch and length check drives the layer at; a forward pre-hook on the parent's
first layer of that class records what the parent passes, and the layer is driven with it. The parent
runs only up to that call; one recording a (batch, length). A file whose parent cannot be built or
run at those sizes is driven as it was (its error says which argument was missing).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from handformer.check.core.result import LearnerError, Text, text
from handformer.check.core.source import source_text

PARENT_VOCAB = 29  # the token ids the parent is run on: below any vocabulary check builds with
NOTES: dict[type, str] = {}  # the layer class -> its parent's name, for the report
RECORDED: dict[int, Callable[[int, int], dict[str, Any] | None]] = {}  # id(layer) -> its parent's call


class _Seen(Exception):  # noqa: N818 - not an error: the parent's call was recorded
    pass


def _required(cls: type) -> list[str]:
    params = list(inspect.signature(cls.forward).parameters.values())[1:]
    return [p.name for p in params if (p.kind, p.default) in REQUIRED]


REQUIRED = {(inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty),
            (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.empty)}


def _builds(parent: type, child: type, classes: dict[str, type], seen: set[str]) -> bool:
    """Whether `parent`'s source names `child` or a class of the file that builds it."""
    named = set(re.findall(r"\w+", source_text(parent)))
    fresh = (named & classes.keys()) - seen
    seen |= fresh
    return child.__name__ in named or any(_builds(classes[n], child, classes, seen) for n in fresh)


def parents_of(cls: type) -> list[type]:
    """The learner's module classes (cls's own file) that build `cls`, directly or through another."""
    own = vars(sys.modules[cls.__module__]).items()
    here = (cls.__module__, True)
    classes = {n: c for n, c in own  # the module classes the file defines
               if (getattr(c, "__module__", None), nn.Module in getattr(c, "__mro__", ())) == here}
    return [c for c in classes.values() if c is not cls and _builds(c, cls, classes, {c.__name__})]


@torch.no_grad()
def record(parent: nn.Module, cls: type, ids: Tensor) -> dict[str, Any]:
    """The arguments (by name) the parent's forward hands its first layer of class `cls` on `ids`;
    none when it hands none or raises before."""
    layer = next(m for m in parent.modules() if type(m) is cls)
    seen: dict[str, Any] = {}

    def hook(_: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        seen.update(inspect.signature(layer.forward).bind(*args, **kwargs).arguments)
        raise _Seen

    handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        parent(ids)
    except Exception:  # noqa: BLE001 - _Seen, or their parent does not run on ids alone: not this one
        pass
    handle.remove()
    return seen


def through_parent_(module: nn.Module, sizes: dict[str, Any], build: Callable[[type, dict[str, Any]], Any],
                    ) -> None:
    """`module`'s forward, where a call leaves out arguments it requires, given those its parent passes
    (see the module's docstring) where the parent handed a stream of the shape check drives it at (a
    parent built at other sizes, from the file's own call, hands one of another width: not used); every
    other call as written."""
    cls = type(module)
    required = _required(cls)
    parents = required[1:] and parents_of(cls)
    if not parents:
        return
    forward, signature = module.forward, inspect.signature(module.forward)

    @functools.cache  # one recording a (batch, length)
    def at(B: int, T: int) -> dict[str, Any]:
        ids = torch.randint(0, PARENT_VOCAB, (B, T), generator=torch.Generator().manual_seed(0))
        return next(filter(None, (_run(p, cls, sizes, build, ids) for p in parents)), {})

    def passed(x: Any) -> dict[str, Any]:
        given = at(*(tuple(getattr(x, "shape", ())) + (0, 0))[:2])  # (B, T) of the stream, if any
        stream = next(iter(given.values()), None)
        return {True: given, False: {}}[getattr(stream, "shape", None) == getattr(x, "shape", ())]

    @functools.wraps(forward)  # its signature, as check reads it
    def driven(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError:  # a call that does not fit: as their forward answers it
            return forward(*args, **kwargs)
        missing = [n for n in required if n not in bound.arguments]
        given = passed(next(iter(bound.arguments.values()), None)) if missing else {}
        bound.arguments.update({n: given[n] for n in given.keys() & set(missing)})
        return forward(*bound.args, **bound.kwargs)

    module.forward = driven  # type: ignore[method-assign]
    RECORDED[id(module)] = at


def handed_apart(module: Any) -> set[str]:
    """The forward arguments of `module` that its parent hands something other than a stream of the
    first argument's shape (a table (T, Dh/2), a mask): never a query, key or value, whatever their
    place (RoFormer's forward(x, mask, pos_emb), forward(x, angles)); none where no parent was found."""
    given = RECORDED.get(id(module), lambda B, T: {})(2, 5)
    values = list(given.values())
    return {n for n, v in list(given.items())[1:] if getattr(v, "shape", None) != values[0].shape}


def _run(parent: type, cls: type, sizes: dict[str, Any], build: Callable[[type, dict[str, Any]], Any],
         ids: Tensor) -> dict[str, Any]:
    try:
        given = record(build(parent, {**sizes, "src_vocab": PARENT_VOCAB, "n_layers": 1}).eval(), cls, ids)
    except Exception:  # noqa: BLE001 - a parent check cannot build or run: not this one
        return {}
    NOTES.update(dict.fromkeys([cls] * bool(given), parent.__name__))  # the report says so where it was
    return given


def parent_note(cls: Any) -> list[Text]:
    """The report's note for a layer driven with what its parent passes."""
    name = NOTES.get(cls)
    return [text(f"driven with the inputs your {name} passes it (a table, a mask it computes)",
                 f"用你的 {name} 传给它的输入驱动（它算出的表、掩码）")] * bool(name)


RAISED = ("check drove it with the inputs your {} passes it for the arguments check cannot fill, and it "
          "raised on the others, which check chose: they may not be of the form your {} hands it",
          "检查程序用你的 {} 传给它的输入填上它填不了的参数，它在检查程序自己选的其他输入上出错："
          "这些输入可能不是你的 {} 给它的形式")


def parent_not_charged(cls: Any, error: LearnerError) -> LearnerError:
    """An exception of a layer's code driven with what its parent passes (`through_parent_`): a reason
    it is NOT CHECKED (check's own inputs beside the parent's may not be of the form the parent hands:
    Llama 4's attention takes its table complex, check hands a (cos, sin) pair); any other error as it is."""
    name = NOTES.get(cls)
    if error.kind != "exception" or not name:
        return error
    en, zh = (said.format(name, name) for said in RAISED)
    return LearnerError("cannot_call", en, error.where, [], zh)
