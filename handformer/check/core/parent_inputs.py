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
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _builds(parent: type, child: type, classes: dict[str, type], seen: set[str]) -> bool:
    """Whether `parent`'s source names `child` or a class of the file that builds it."""
    source = source_text(parent)
    names = [n for n in classes if n not in seen and n in source]
    seen.update(names)
    return child.__name__ in source or any(_builds(classes[n], child, classes, seen) for n in names)


def parents_of(cls: type) -> list[type]:
    """The learner's module classes (cls's own file) that build `cls`, directly or through another."""
    module = sys.modules.get(cls.__module__)
    classes = {n: c for n, c in vars(module).items() if isinstance(c, type) and issubclass(c, nn.Module)
               and c is not cls and c.__module__ == cls.__module__ and "forward" in vars(c)}
    return [c for c in classes.values() if _builds(c, cls, classes, {c.__name__})]


def record(parent: nn.Module, cls: type, ids: Tensor) -> dict[str, Any] | None:
    """The arguments (by name) the parent's forward hands its first layer of class `cls` on `ids`;
    None when it hands none or raises before."""
    layer = next((m for m in parent.modules() if type(m) is cls), None)
    seen: dict[str, Any] = {}

    def hook(_: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        seen.update(inspect.signature(layer.forward).bind(*args, **kwargs).arguments)
        raise _Seen

    if layer is None:
        return None
    handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            parent(ids)
    except _Seen:
        return seen
    except Exception:  # noqa: BLE001 - their parent does not run on ids alone: not this one
        return None
    finally:
        handle.remove()
    return None


def _same_stream(given: dict[str, Any], x: Tensor) -> bool:
    """Whether the parent handed its layer a stream of the shape check drives it at (a parent built at
    other sizes, from the file's own call, hands one of another width: not used)."""
    return any(isinstance(v, Tensor) and v.shape == x.shape for v in given.values())


def _as(value: Any, like: Tensor) -> Any:
    """A floating tensor the parent passed, at the dtype check drives the layer at."""
    return value.to(like.dtype) if isinstance(value, Tensor) and value.is_floating_point() else value


def through_parent_(module: nn.Module, sizes: dict[str, Any], build: Callable[[type, dict[str, Any]], Any],
                    ) -> None:
    """`module`'s forward, where a call leaves out arguments it requires, given those its parent passes
    (see the module's docstring); every other call as written."""
    cls = type(module)
    required = _required(cls) if "forward" in vars(cls) else []
    parents = parents_of(cls) if required[1:] else []
    if not parents:
        return
    forward, signature, recorded = module.forward, inspect.signature(module.forward), {}

    def passed(B: int, T: int) -> dict[str, Any] | None:
        if (B, T) not in recorded:
            ids = torch.randint(0, PARENT_VOCAB, (B, T), generator=torch.Generator().manual_seed(0))
            recorded[B, T] = next(filter(None, (_run(p, cls, sizes, build, ids) for p in parents)), None)
        return recorded[B, T]

    @functools.wraps(forward)  # its signature, as check reads it
    def driven(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind_partial(*args, **kwargs)
        missing = [n for n in required if n not in bound.arguments]
        x = next((a for a in args if isinstance(a, Tensor) and a.dim() >= 2), None)
        given = passed(*x.shape[:2]) if missing and x is not None else None
        if not given or any(n not in given for n in missing) or not _same_stream(given, x):
            return forward(*args, **kwargs)
        bound.arguments.update({n: _as(given[n], x) for n in missing})
        return forward(*bound.args, **bound.kwargs)

    module.forward = driven  # type: ignore[method-assign]
    RECORDED[id(module)] = passed


def handed_apart(module: Any) -> set[str]:
    """The forward arguments of `module` that its parent hands something other than a stream of the
    first argument's shape (a table (T, Dh/2), a mask): never a query, key or value, whatever their
    place (RoFormer's forward(x, mask, pos_emb), forward(x, angles)); none where no parent was found."""
    passed = RECORDED.get(id(module), lambda B, T: None)(2, 5)
    if not passed:
        return set()
    stream = next(iter(passed.values()))
    return {n for n, v in list(passed.items())[1:] if not (isinstance(v, Tensor) and v.shape == stream.shape)}


def _run(parent: type, cls: type, sizes: dict[str, Any], build: Callable[[type, dict[str, Any]], Any],
         ids: Tensor) -> dict[str, Any] | None:
    try:
        built = build(parent, {**sizes, "src_vocab": PARENT_VOCAB, "n_layers": 1})
    except Exception:  # noqa: BLE001 - a parent check cannot build: not this one
        return None
    if not isinstance(built, nn.Module):
        return None
    given = record(built.eval(), cls, ids)
    if given is not None:
        NOTES[cls] = parent.__name__
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
